"""Session 16 probe: where a call's first audio spends its time outside the engine core.

`server ARGS...` runs the real server (python -m tts_service ARGS) with timestamps added in the front process;
`client OUT ARGS...` runs the load generator (python -m clients.loadgen ARGS) and keeps each call's absolute
times; `report SERVER_JSON CLIENT_JSON...` matches calls and prints each hop's p50/p95/mean. Every time is
CLOCK_MONOTONIC, shared by the processes of one machine."""
import atexit
import json
import sys
import time

OFFSET = time.monotonic() - time.perf_counter()


def server(argv):
    from tts_service.api import server as S
    from tts_service.api.main import main
    from tts_service.engine import engine_process as EP
    from tts_service.engine.streams import AudioChunk
    times = {}
    out = argv[0]

    def mark(rid, key, t):
        times.setdefault(rid, {}).setdefault(key, t)

    orig_apply = EP.EngineProcess._apply

    def apply(self, batch):
        t = time.monotonic()
        for entry in batch.items:
            if isinstance(entry.item, AudioChunk):
                mark(entry.request_id, "recv", t)
        return orig_apply(self, batch)
    EP.EngineProcess._apply = apply

    orig_submit = S.TextToSpeechService.submit

    async def submit(self, prepared, record, remaining_s, is_text_open):
        mark(record.request_id, "submit_start", time.monotonic())
        try:
            return await orig_submit(self, prepared, record, remaining_s, is_text_open)
        finally:
            mark(record.request_id, "submit_end", time.monotonic())
    S.TextToSpeechService.submit = submit

    orig_finish = S.TextToSpeechService._finish_record

    def finish(self, record, summary):
        orig_finish(self, record, summary)
        d = times.setdefault(record.request_id, {})
        d["rpc"] = record.rpc
        d["handler"] = record.started
        if record.chunks_sent:
            d["sent"] = record.chunks_sent[0].arrival_s
        tl = summary.timeline
        d.update(core_arrival=tl.arrival, core_admitted=tl.admitted, core_first_frame=tl.first_frame,
                 core_first_audio=tl.first_audio)
    S.TextToSpeechService._finish_record = finish

    atexit.register(lambda: json.dump(times, open(out, "w")))
    return main(argv[1:])


def client(argv):
    import clients.loadgen.run as R
    from clients.loadgen.__main__ import main
    calls = []
    orig = R._record

    def record(request, start_lag_s, status, started, first_text_sent, arrivals, completion, ended):
        calls.append(dict(index=request.index, rpc=request.rpc, status=status, started=started + OFFSET,
                          first_text=first_text_sent[0] + OFFSET if first_text_sent else None,
                          first_arrival=arrivals[0].arrival_s + OFFSET if arrivals else None))
        return orig(request, start_lag_s, status, started, first_text_sent, arrivals, completion, ended)
    R._record = record
    code = main(argv[1:])
    json.dump(calls, open(argv[0], "w"))
    return code


def report(argv):
    import numpy as np
    srv = json.load(open(argv[0]))
    rows = [dict(v, id=k) for k, v in srv.items() if "handler" in v and "sent" in v]
    rpc_name = {"online": "SynthesizeOnline", "streaming": "StreamingSynthesize"}
    result = {}
    for path in argv[1:]:
        calls = [c for c in json.load(open(path)) if c["status"] == "OK" and c["first_arrival"]]
        hops = {k: [] for k in ("client_to_handler", "handler_to_submit", "submit_rtt", "submit_to_core_arrival",
                                "core_ttfa", "core_audio_to_recv", "recv_to_sent", "sent_to_client",
                                "client_ttfa", "outside_core")}
        used = set()
        for c in calls:
            cands = [r for r in rows if r["rpc"] == rpc_name[c["rpc"]] and r["id"] not in used
                     and 0 <= r["handler"] - c["started"] < 0.05]
            if not cands:
                continue
            r = min(cands, key=lambda r: r["handler"] - c["started"])
            used.add(r["id"])
            ms = lambda a, b: 1000 * (b - a)
            hops["client_to_handler"].append(ms(c["started"], r["handler"]))
            hops["handler_to_submit"].append(ms(r["handler"], r["submit_start"]))
            hops["submit_rtt"].append(ms(r["submit_start"], r["submit_end"]))
            hops["submit_to_core_arrival"].append(ms(r["submit_start"], r["core_arrival"]))
            hops["core_ttfa"].append(ms(r["core_arrival"], r["core_first_audio"]))
            hops["core_audio_to_recv"].append(ms(r["core_first_audio"], r["recv"]))
            hops["recv_to_sent"].append(ms(r["recv"], r["sent"]))
            hops["sent_to_client"].append(ms(r["sent"], c["first_arrival"]))
            t0 = c["first_text"]
            hops["client_ttfa"].append(ms(t0, c["first_arrival"]))
            hops["outside_core"].append(ms(t0, c["first_arrival"]) - ms(r["core_arrival"], r["core_first_audio"]))
        stats = {k: dict(n=len(v), p50=float(np.percentile(v, 50)), p95=float(np.percentile(v, 95)),
                         mean=float(np.mean(v))) for k, v in hops.items() if v}
        result[path] = stats
        print(path, f"matched {len(hops['client_ttfa'])} of {len(calls)}")
        for k, s in stats.items():
            print(f"  {k:24s} p50 {s['p50']:7.2f}  p95 {s['p95']:7.2f}  mean {s['mean']:7.2f} ms")
    return result


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "report":
        json.dump(report(args[1:]), open(args[0], "w"), indent=1)
    else:
        raise SystemExit({"server": server, "client": client}[command](args))
