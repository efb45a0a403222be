#!/usr/bin/env bash
# The voice-agent features on one GPU machine, one server (random 1.7B CustomVoice weights with the random 0.6B
# forced aligner loaded): the load generator at RATE req/s without and then with word timestamps on every request
# (30 s each, mixed calls), then barge-in trials (benchmarks/barge_in.py) beside the same load. Results in
# $OUT/voice_agents/: loadgen.txt, summary.json (both loads' summaries and the barge-in figures).
#     bash benchmarks/device_voice_agents.sh [RATE [SERVER_FLAG ...]]
set -u
source benchmarks/device_server.sh  # installs the carried wheels into /tmp/site
rate=${1:-20}
out=$OUT/voice_agents
port=50161
start_server "$out" random:1.7b-custom_voice $port --aligner-model random:0.6b --max-calls-per-caller 100000 "${@:2}"
for label in plain words; do
  flag=""; [[ $label == words ]] && flag=--word-timestamps
  python3 -m clients.loadgen --server 127.0.0.1:$port --rate "$rate" --duration 30 --rpc mixed --seed 1 $flag \
      --out "$out/lg-$label.json.gz" | tee -a "$out/loadgen.txt"
done
python3 -m clients.loadgen --server 127.0.0.1:$port --rate "$rate" --duration 45 --rpc mixed --seed 2 \
    --out "$out/lg-beside.json.gz" > "$out/loadgen-beside.txt" &
load=$!
sleep 5
python3 -m benchmarks.barge_in --server 127.0.0.1:$port --trials 100 --out "$out/barge_in.json"
wait $load
stop_server
server_log_faults "$out/server.log"
python3 - "$out" <<'PY'
import gzip, json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {"barge_in": json.loads((out / "barge_in.json").read_text())}
for path in sorted(out.glob("lg-*.json.gz")):
    with gzip.open(path, "rt") as file:
        summary[path.name.removeprefix("lg-").removesuffix(".json.gz")] = json.load(file)["summary"]
    path.unlink()
(out / "summary.json").write_text(json.dumps(summary, indent=1))
PY
rm -f "$out/server.log"
