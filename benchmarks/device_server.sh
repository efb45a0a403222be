# Sourced by the device scripts that drive a real server on a GPU machine with no network:
#     source benchmarks/device_server.sh; start_server OUT_DIR MODEL PORT [SERVER_FLAG ...]
# It installs the carried wheels (.whl/site, .whl/grpc, .whl/otel: fetched here by benchmarks/fetch_wheels.sh),
# starts `python -m tts_service` logging into OUT_DIR/server.log, stops it with SIGTERM when the script exits
# (or at `stop_server`, which waits for it), and returns once the server answers SERVING (health Watch: no polling).
# With SERVER_PROFILE=FILE set, the server's process runs under cProfile, which writes FILE when it stops.
install_wheels() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install_wheels /tmp/site .whl/site/*.whl .whl/grpc/*.whl .whl/otel/*.whl
export PYTHONPATH="$PWD:$PWD/proto:/tmp/site" PYTHONUNBUFFERED=1

start_server() {
  local out=$1 model=$2 port=$3
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
  python3 ${SERVER_PROFILE:+-m cProfile -o "$SERVER_PROFILE"} -m tts_service --model "$model" --port "$port" --host 127.0.0.1 "${@:4}" > "$out/server.log" 2>&1 &
  server=$!
  trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
  python3 - "$port" <<'PY'
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
# Watch streams every status change, so this waits for SERVING without polling.
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}"))
for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=240, wait_for_ready=True):
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        break
PY
}

# The server process's user and system CPU seconds so far (its engine cores are processes of their own).
server_cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f %.2f", $14 / hz, $15 / hz}' "/proc/$server/stat"; }

# The lines of a server's log that say something went wrong: a traceback or error, a core killed for a stall, a
# garbage collection that paused a process (each in the words the server writes).
server_log_faults() { grep -i -E "traceback|error|made no progress|garbage collection paused" "$1" | head -20; }

stop_server() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  trap - EXIT
}
