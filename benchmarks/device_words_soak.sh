#!/usr/bin/env bash
# Does a server survive word-timestamp load? On every GPU of the machine at once, servers one after another (random
# 1.7B CustomVoice weights, the random 0.6B aligner, the default stall watch), each driven by the load generator with
# every request asking for word timestamps at RATE req/s for SECONDS; no new server starts after UNTIL seconds.
# $OUT/soak-gpuN.txt gets a line per server (its load table row and the calls' failures by status); for a server
# whose calls failed or whose log names a CUDA error, a stall or a traceback, also its log's error lines, the raw
# lines (a stalled core writes its threads' stacks there before it is killed) and, where CUDA wrote a core dump on
# the fault, the kernel cuda-gdb finds in it.
# SOAK_GPUS="0 2" soaks only those GPUs (all of them by default), so one machine can soak two trees side by side.
# Further arguments are server flags, e.g. the green-context probe's (5a88a35, reverted), which brought the fault within
# 30 s: run from a tree of that commit with `... 20 40 420 --aligner-sms 16`.
#     bash benchmarks/device_words_soak.sh 40 40 420 [SERVER_FLAG ...]
set -u
source benchmarks/device_server.sh > /dev/null
rate=${1:-40}; seconds=${2:-40}; until_s=${3:-420}; server_flags=("${@:4}")
# A light dump (no memory images): written in seconds, where a whole one was cut short when the process aborted.
export CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_LIGHTWEIGHT_COREDUMP=1 CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION=0
export CUDA_COREDUMP_GENERATION_FLAGS="skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_constbank_memory"
SECONDS=0

soak() {
  local gpu=$1 port=$((50181 + $1)) cycle=0 report=$OUT/soak-gpu$1.txt
  export CUDA_VISIBLE_DEVICES=$gpu CUDA_COREDUMP_FILE=/tmp/soak-core-$gpu.%p
  while (( SECONDS < until_s )); do
    cycle=$((cycle + 1))
    local out=/tmp/soak-$gpu-$cycle
    start_server "$out" random:1.7b-custom_voice "$port" --aligner-model random:0.6b --max-calls-per-caller 100000 \
        "${server_flags[@]}"
    python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration "$seconds" --rpc mixed \
        --seed "$((cycle * 10 + gpu))" --word-timestamps --out "$out/lg.json.gz" | tail -1 | sed "s/^/server $cycle: /" >> "$report"
    stop_server
    local failures
    failures=$(python3 -c "import gzip, json, sys; print(json.load(gzip.open(sys.argv[1]))['summary']['errors_by_status'])" \
        "$out/lg.json.gz")
    echo "server $cycle: failed calls by status $failures" >> "$report"
    if [[ $failures != "{}" ]] || grep -q -i -E "illegal|cuda error|no progress|traceback" "$out/server.log"; then
      {
        echo "server $cycle: its log's error lines, then its last raw lines"
        grep -E '"level": "(ERROR|CRITICAL)"' "$out/server.log" | head -12 | cut -c1-2000
        grep -v '"level"' "$out/server.log" | grep -v "^$" | tail -60 | cut -c1-300
        for dump in /tmp/soak-core-$gpu.*; do
          [[ -e $dump ]] || continue
          timeout 120 cuda-gdb -batch -ex "target cudacore $dump" -ex "info cuda kernels" -ex "info cuda exceptions" \
              2>&1 | tail -30
          rm -f "$dump"
        done
      } >> "$report"
    fi
    rm -rf "$out"
  done
}

for gpu in ${SOAK_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader)}; do
  soak "$gpu" &
done
wait
for gpu in ${SOAK_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader)}; do
  cut -c1-400 "$OUT/soak-gpu$gpu.txt"
done
