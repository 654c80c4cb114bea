#!/usr/bin/env bash
# Several server lives in one device call, one after the other (serve_on_device.sh each).
#   bash .device/gpue2e/serve_lives.sh TAG "NAME|KNOB=value KNOB=value" ...
# Each life writes under its own directory, and after each life every directory so far is
# packed into $OUT/TAG.tgz: a call returns at most eight files from $OUT, and a call cut at
# its limit still returns the lives it finished. TAG.tgz also holds times.txt (each life's
# exit status and wall seconds) and each life's stdout/stderr.
set -u -o pipefail
if [ $# -lt 2 ]; then
  echo "usage: serve_lives.sh TAG 'NAME|KNOB=value ...' ..." >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
TAG=$1; shift
: "${OUT:?OUT must name the folder the device call returns}"
WORK_LIVES=/tmp/serve-lives-$TAG
rm -rf "$WORK_LIVES" && mkdir -p "$WORK_LIVES"
for life in "$@"; do
  name=${life%%|*}
  knobs=${life#*|}
  [ "$knobs" = "$life" ] && knobs=
  case $name in ''|*/*|.*) echo "serve_lives: bad life name '$name'" >&2; exit 2;; esac
  t0=$(date +%s)
  # The knobs are words on purpose: each one is an environment assignment for env(1).
  # shellcheck disable=SC2086
  env $knobs OUT="$WORK_LIVES/$name" bash "$HERE/serve_on_device.sh" \
    > "$WORK_LIVES/$name.stdout" 2> "$WORK_LIVES/$name.stderr"
  echo "$name rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$WORK_LIVES/times.txt"
  tar -czf "$OUT/$TAG.tgz.part" -C "$WORK_LIVES" . && mv "$OUT/$TAG.tgz.part" "$OUT/$TAG.tgz"
done
