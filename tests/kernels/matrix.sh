#!/usr/bin/env bash
# Runs the kernel probe tests on each (kernel, attach mode) leg and prints one summary line per
# leg; exits non-zero when any leg fails. Legs:
#   host        this machine's kernel, --attach tracepoint, run directly (no VM)
#   kprobe      a stock Debian kernel under QEMU (tests/kernels/run.sh), --attach kprobe
#   tracepoint  the same guest kernel, --attach tracepoint
# See docs/kernel-matrix.md.
set -euo pipefail

usage() {
	cat <<'EOF'
usage: tests/kernels/matrix.sh [--legs LIST] [--kernel VERSION] [--timeout SECONDS] [-- COMMAND...]

  --legs LIST        comma-separated subset of host,kprobe,tracepoint (default: all three)
  --kernel VERSION   guest kernel (default: resolved from linux-image-amd64, see run.sh)
  --timeout SECONDS  per guest leg (default 420)
  COMMAND            what each leg runs, in the project checkout with OFFCPU_ATTACH set
                     (default: $OFFCPU_VENV/bin/python -m pytest -m kernel tests/e2e,
                     OFFCPU_VENV defaulting to the checkout's .venv)
EOF
}

log() { printf 'matrix.sh: %s\n' "$*" >&2; }
fail() { log "$*"; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
legs=host,kprobe,tracepoint
kernel=""
timeout_s=420

while [ $# -gt 0 ]; do
	case "$1" in
	--legs) [ $# -ge 2 ] || fail "--legs needs a value"; legs=$2; shift 2 ;;
	--kernel) [ $# -ge 2 ] || fail "--kernel needs a value"; kernel=$2; shift 2 ;;
	--timeout) [ $# -ge 2 ] || fail "--timeout needs a value"; timeout_s=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; fail "unexpected argument: $1 (the command goes after --)" ;;
	esac
done
IFS=, read -r -a leg_list <<<"$legs"
[ ${#leg_list[@]} -gt 0 ] || fail "--legs is empty"
for leg in "${leg_list[@]}"; do
	case "$leg" in host | kprobe | tracepoint) ;; *) fail "unknown leg '$leg' (host, kprobe, tracepoint)" ;; esac
done
if [ $# -gt 0 ]; then
	command=("$@")
else
	venv=${OFFCPU_VENV:-$project/.venv}
	[ -x "$venv/bin/python" ] || fail "no $venv/bin/python: run scripts/setup --test or set OFFCPU_VENV"
	command=("$venv/bin/python" -m pytest -m kernel tests/e2e)
fi

guest_kernel=""
if [[ ",$legs," == *,kprobe,* || ",$legs," == *,tracepoint,* ]]; then
	guest_kernel=$("$here/run.sh" ${kernel:+--kernel "$kernel"} --print-kernel) \
		|| fail "cannot resolve the guest kernel"
fi

summary=()
failed=0
for leg in "${leg_list[@]}"; do
	if [ "$leg" = host ]; then
		name="kernel $(uname -r) / tracepoint"
	else
		name="kernel $guest_kernel / $leg"
	fi
	printf '\n=== %s: %s\n' "$name" "${command[*]}"
	start=$(date +%s.%N)
	rc=0
	if [ "$leg" = host ]; then
		(cd "$project" && OFFCPU_ATTACH=tracepoint "${command[@]}") || rc=$?
	else
		"$here/run.sh" --kernel "$guest_kernel" --attach "$leg" --timeout "$timeout_s" -- "${command[@]}" || rc=$?
	fi
	end=$(date +%s.%N)
	seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')
	if [ $rc -eq 0 ]; then
		summary+=("$name: passed ($seconds s)")
	else
		summary+=("$name: FAILED ($seconds s)")
		failed=1
	fi
done

printf '\n'
printf '%s\n' "${summary[@]}"
exit $failed
