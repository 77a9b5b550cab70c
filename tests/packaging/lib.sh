# shellcheck shell=bash
# Helpers for the packaging tests (sourced). Every check says what it expected.

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# require_env NAME...: the variables tests/packaging/CMakeLists.txt passes.
require_env() {
  local v
  for v in "$@"; do
    [ -n "${!v:-}" ] || fail "$v is not set (run this through ctest)"
  done
}

# expect_line FILE REGEX WHAT: some line of FILE matches the extended REGEX.
expect_line() {
  grep -Eq -- "$2" "$1" || {
    echo "--- $1" >&2
    cat "$1" >&2
    fail "$3: no line matches /$2/ in $1"
  }
}

# expect_text FILE REGEX WHAT: FILE, its lines joined by single spaces (CMake
# wraps its messages where a path's length says), matches REGEX.
expect_text() {
  tr -s ' \n' ' ' <"$1" | grep -Eq -- "$2" || {
    echo "--- $1" >&2
    cat "$1" >&2
    fail "$3: /$2/ is not in $1"
  }
}

# expect_no_line FILE REGEX WHAT
expect_no_line() {
  if grep -En -- "$2" "$1" >&2; then
    fail "$3: the lines above match /$2/ in $1"
  fi
}

# run_logged LOG CMD...: runs CMD with its output in LOG; on failure shows it.
run_logged() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$* (log: $log)"
  fi
}

# elf_files DIR: the ELF files under DIR.
elf_files() {
  local f
  find "$1" -type f | while read -r f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "177ELF" ] && echo "$f"
  done
}

# expect_relocatable_runpaths DIR: every RUNPATH entry of every ELF file under
# DIR is relative to $ORIGIN (no build tree, wheel or staging path), and every
# library each one needs resolves (ldd).
expect_relocatable_runpaths() {
  local f rp entry entries
  while read -r f; do
    rp=$(readelf -d "$f" | sed -n 's/.*(R.*PATH).*\[\(.*\)\]/\1/p')
    IFS=: read -ra entries <<<"$rp"
    for entry in "${entries[@]}"; do
      # shellcheck disable=SC2016 # a literal $ORIGIN
      [[ $entry == '$ORIGIN'* ]] || fail "$f: run path entry '$entry' is not relative to \$ORIGIN"
    done
    if ldd "$f" | grep -q 'not found'; then
      ldd "$f" >&2
      fail "$f: a library it needs is not found"
    fi
  done < <(elf_files "$1")
}

# The libraries every Debian 12 and Ubuntu 22.04/24.04 system has, which a
# package may leave to the system: glibc's, GCC's, libsystemd; and the CUDA
# driver's, which is the node's.
system_libraries='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libresolv\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libsystemd\.so\.0|libcuda\.so\.1)$'

# expect_self_contained DIR: every library that an ELF file under DIR needs
# is either one of $system_libraries or lies in one of that file's own run
# path directories (so the loader finds it there, whatever the system has).
expect_self_contained() {
  local f needed origin rp entry dirs found
  while read -r f; do
    origin=$(dirname "$f")
    rp=$(readelf -d "$f" | sed -n 's/.*(R.*PATH).*\[\(.*\)\]/\1/p')
    IFS=: read -ra dirs <<<"${rp//\$ORIGIN/$origin}"
    while read -r needed; do
      [[ $needed =~ $system_libraries ]] && continue
      found=
      for entry in "${dirs[@]}"; do
        [ -e "$entry/$needed" ] && found=$entry && break
      done
      [ -n "$found" ] || fail "$f needs $needed, which is neither in its run path (${rp:-none}) nor on every system"
    done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done < <(elf_files "$1")
}

# highest_symbol_version DIR PREFIX: "PREFIX_X.Y FILE", the highest version of
# the PREFIX_ symbols (GLIBC, GLIBCXX) that an ELF file under DIR needs.
highest_symbol_version() {
  local f
  while read -r f; do
    { objdump -T "$f" | grep -oE "\\b$2_[0-9]+(\\.[0-9]+)*\\b" || true; } | sort -uV | tail -1 |
      sed "s|\$| $f|"
  done < <(elf_files "$1") | sort -V | tail -1
}
