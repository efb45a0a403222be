#!/usr/bin/env bash
# A book chapter in one request on one GPU machine (random 1.7B CustomVoice weights): the load generator alone at
# RATE req/s, the chapter (MINUTES of reading) alone, then the chapter again with the load generator beside it for
# 45 s (the chapter's call ended after 60 s). Results in $OUT/chapter/: loadgen.txt and summary.json.
#     bash benchmarks/device_chapter.sh [MINUTES [RATE]]
set -u
source benchmarks/device_server.sh  # installs the carried wheels into /tmp/site
minutes=${1:-60}
rate=${2:-40}
out=$OUT/chapter
port=50163
start_server "$out" random:1.7b-custom_voice $port --max-calls-per-caller 100000
python3 -m clients.loadgen --server 127.0.0.1:$port --rate "$rate" --duration 45 --rpc mixed --seed 1 \
    --out "$out/lg-alone.json.gz" | tee -a "$out/loadgen.txt"
python3 -m benchmarks.chapter --server 127.0.0.1:$port --minutes "$minutes" --out "$out/chapter-alone.json"
python3 -m benchmarks.chapter --server 127.0.0.1:$port --minutes "$minutes" --seed 2 --max-wall-seconds 60 \
    --label beside-load --out "$out/chapter-beside.json" &
chapter=$!
sleep 5
python3 -m clients.loadgen --server 127.0.0.1:$port --rate "$rate" --duration 45 --rpc mixed --seed 1 \
    --out "$out/lg-beside.json.gz" | tee -a "$out/loadgen.txt"
wait $chapter
stop_server
server_log_faults "$out/server.log"
python3 - "$out" <<'PY'
import gzip, json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {path.stem.removeprefix("chapter-"): json.loads(path.read_text()) for path in sorted(out.glob("chapter-*.json"))}
for path in sorted(out.glob("lg-*.json.gz")):
    with gzip.open(path, "rt") as file:
        summary["loadgen_" + path.name.removeprefix("lg-").removesuffix(".json.gz")] = json.load(file)["summary"]
    path.unlink()
(out / "summary.json").write_text(json.dumps(summary, indent=1))
PY
rm -f "$out/server.log"
