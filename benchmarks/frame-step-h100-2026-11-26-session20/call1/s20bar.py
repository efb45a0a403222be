"""Session 20: what one grid-wide barrier costs, by form. One program per SM, 8 warps, N barriers each after a
small store (a phase's output), the kernel timed in a CUDA graph; us per barrier = kernel time / N.
Forms: 0 the predictor pass's own (release atomic by one thread, every warp polling a volatile load, bar.sync);
1 the same arrival, one thread polling with ld.acquire; 2 one thread arriving with red.release (no return) and
polling with ld.acquire; 3 as 2 but the poll a relaxed volatile load (ordering from the control dependency and
bar.sync, as form 0)."""
import json, statistics, sys, time
import torch
import triton
import triton.language as tl


@triton.jit
def _arrive(arrivals_ptr, FORM: tl.constexpr):
    tl.debug_barrier()
    if FORM <= 1:
        tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")
    else:
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_s; .reg .u32 %t_s;
            mov.u32 %t_s, %tid.x; setp.ne.u32 %p_s, %t_s, 0;
            @!%p_s red.release.gpu.global.add.u32 [$1], 1;
            mov.u32 $0, 0; }""", "=r,l", [arrivals_ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait(arrivals_ptr, target, FORM: tl.constexpr):
    if FORM == 0:
        seen = tl.load(arrivals_ptr, volatile=True)
        while seen < target:
            seen = tl.load(arrivals_ptr, volatile=True)
    elif FORM == 3:
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_s; .reg .u32 %t_s; .reg .s32 %v_s;
            mov.u32 %t_s, %tid.x; setp.ne.u32 %p_s, %t_s, 0;
            @%p_s bra DONE_S;
            WAIT_S: ld.volatile.global.s32 %v_s, [$1];
            setp.lt.s32 %p_s, %v_s, $2;
            @%p_s bra WAIT_S;
            DONE_S: mov.u32 $0, 0; }""", "=r,l,r", [arrivals_ptr, target], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_s; .reg .u32 %t_s; .reg .s32 %v_s;
            mov.u32 %t_s, %tid.x; setp.ne.u32 %p_s, %t_s, 0;
            @%p_s bra DONE_S;
            WAIT_S: ld.acquire.gpu.global.s32 %v_s, [$1];
            setp.lt.s32 %p_s, %v_s, $2;
            @%p_s bra WAIT_S;
            DONE_S: mov.u32 $0, 0; }""", "=r,l,r", [arrivals_ptr, target], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _barriers_kernel(arrivals_ptr, scratch_ptr, num_barriers, FORM: tl.constexpr):
    program = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.arange(0, 256)
    arrived = 0
    for step in range(num_barriers):
        # Each program reads what its neighbour wrote before the barrier: a wrong barrier shows as a bad sum.
        seen = tl.load(scratch_ptr + ((program + 1) % num_programs) * 256 + cols, cache_modifier=".cg")
        tl.store(scratch_ptr + num_programs * 256 + program * 256 + cols, seen)
        tl.debug_barrier()
        tl.store(scratch_ptr + program * 256 + cols, seen + 1)
        _arrive(arrivals_ptr, FORM)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, FORM)


def main() -> None:
    out_path = sys.argv[1]
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    arrivals = torch.zeros(1, dtype=torch.int32, device="cuda")
    scratch = torch.zeros(2 * programs * 256, dtype=torch.int32, device="cuda")
    report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "programs": programs,
              "results": []}
    graphs = {}
    num_barriers = 260
    for form in (0, 1, 2, 3):
        def call(form=form):
            arrivals.zero_()
            scratch.zero_()
            _barriers_kernel[(programs,)](arrivals, scratch, num_barriers, FORM=form, num_warps=8)
        call()
        torch.cuda.synchronize()
        # Every step each program stored its neighbour's count: after N steps all read N - 1.
        last = scratch[programs * 256:].view(programs, 256)
        correct = bool((last == num_barriers - 1).all())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graphs[form] = (graph, correct)
    times = {form: [] for form in graphs}
    for _ in range(7):
        for form, (graph, _) in graphs.items():
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
            end.synchronize()
            times[form].append(start.elapsed_time(end) / 20 * 1e3 / num_barriers)
    for form, (_, correct) in graphs.items():
        row = {"form": form, "us_per_barrier": statistics.median(times[form]),
               "rounds": [round(t, 3) for t in times[form]], "correct": correct}
        report["results"].append(row)
        print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
