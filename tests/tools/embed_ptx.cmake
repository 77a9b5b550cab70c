# cmake -DPTX=in.ptx -DOUT=out.hpp -DSYMBOL=name -P embed_ptx.cmake
# Writes OUT: the PTX text of PTX as `inline constexpr char SYMBOL[]`.
file(READ "${PTX}" text)
file(WRITE "${OUT}.tmp"
     "#pragma once\n// Generated from ${PTX} by tests/tools/embed_ptx.cmake.\n"
     "inline constexpr char ${SYMBOL}[] = R\"rmmd_ptx(${text})rmmd_ptx\";\n")
file(RENAME "${OUT}.tmp" "${OUT}")
