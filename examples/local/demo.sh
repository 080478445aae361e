#!/usr/bin/env bash
# Run the passing drill, then its broken twin, and print both verdicts.
# Succeeds (exit 0) when the first PASSes and the second FAILs — catching the broken
# twin is the point. Set RECOVERYGATE to the command to use (default: recoverygate).
set -u
here=$(cd "$(dirname "$0")" && pwd)
rg=${RECOVERYGATE:-recoverygate}

"$rg" run -f "$here/recovery-test.yaml"
pass=$?
"$rg" run -f "$here/recovery-test-node-local.yaml"
broken=$?

echo
echo "shared checkpoints:     exit $pass (expected 0: PASS)"
echo "node-local checkpoints: exit $broken (expected 1: FAIL, restarted from scratch)"
if [ "$pass" -eq 0 ] && [ "$broken" -eq 1 ]; then
    echo "both verdicts as expected"
    exit 0
fi
echo "unexpected verdicts" >&2
exit 1
