# Session 14 (CPU, this workspace's 2-core AMD EPYC): the scheduler's host time at 128 running decodes, before
# (6d7947b's scheduler/, checked out beside benchmarks/scheduler_host.py in /tmp/oldtree) and after 1466e0f,
# alternated five times.
mkdir -p /tmp/oldtree && git archive 6d7947b scheduler | tar x -C /tmp/oldtree && mkdir -p /tmp/oldtree/benchmarks
cp benchmarks/scheduler_host.py /tmp/oldtree/benchmarks/ && touch /tmp/oldtree/benchmarks/__init__.py
OUT=benchmarks/scheduler-host-cpu-2026-11-26
for i in 1 2 3 4 5; do
  (cd /tmp/oldtree && python -m benchmarks.scheduler_host --out "$OLDPWD/$OUT/before-$i.json")
  python -m benchmarks.scheduler_host --out "$OUT/after-$i.json"
done
