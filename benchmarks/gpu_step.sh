# `step SECONDS NAME COMMAND...` for the GPU check scripts (sourced): run COMMAND with a time
# limit, keep its log as $OUT/NAME.log, print its return code and the log's last ${TAIL:-12}
# lines.
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
step() {
  local limit=$1 name=$2
  shift 2
  echo "=== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$? $name"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
}
