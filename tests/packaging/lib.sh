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
