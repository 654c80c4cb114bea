# rotate-log.sh FILE MAX_BYTES: run by qwen3090.service before each start (ExecStartPre).
#
# vLLM appends every boot to FILE and nothing else ever shortens it, so a server that restarts
# often (or logs a lot) would fill /var/log. Before a start, and only then, FILE is moved to
# FILE.1 when it is larger than MAX_BYTES, replacing the one older copy kept. Nothing writes
# FILE at this point (the server is not running), so no line is lost or split.
#
# FILE always exists afterwards (empty after a rotation): the exporter reading it sees a
# shorter file, starts over from its beginning, and never finds it missing while the GPU gate
# waits (a missing file reads as "boot log unreadable").
#
# POSIX sh and coreutils only (wc, mv); the unit sets PATH to coreutils alone.
set -eu

if [ "$#" -ne 2 ]; then
  echo "usage: rotate-log.sh FILE MAX_BYTES (got $# arguments)" >&2
  exit 2
fi
file=$1
limit=$2
case $limit in
  '' | *[!0-9]*)
    echo "rotate-log.sh: MAX_BYTES must be a whole number of bytes, got '$limit'" >&2
    exit 2
    ;;
esac

if [ -f "$file" ]; then
  size=$(wc -c <"$file")
  if [ "$size" -gt "$limit" ]; then
    mv -f -- "$file" "$file.1"
    echo "rotate-log.sh: $file was $size bytes (limit $limit): moved to $file.1"
  fi
fi
# Create it when missing; never truncate what is there.
: >>"$file"
