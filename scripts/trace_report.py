#!/usr/bin/env python3
"""Reads Chrome traces that Loom wrote (loom-moe --trace, loom_ep_bench --trace, fused_mlp --trace)
and prints, per file:
  - each task type: tasks, first start, last end, median duration and processor time (ms);
  - the processors' occupancy over time: per bin of --bin µs, how many processors each task type
    kept busy on average, and how many were idle;
  - the marks (instant events, TaskContext::trace_mark), if any: how many of each kind fell in
    each bin, split by their first value where --split-marks names the kind. For the
    expert-parallel layer, ep_record_published splits by destination and ep_records_taken by
    source, so that the tables show when each peer's chunk records left this rank and when this
    rank took each peer's records.

  - with --late N: per destination, the N records this rank published last (time, record, the
    processor that sent it), and per source the runs of records taken, in order: a source's
    prefix of landed records is held by the record that lands last;
  - with --phases A,B,...: where a task's time goes, from marks its body records at the ends of
    its phases (kinds A, B, ... by name, "mark N" for a kind the writer did not name): per
    processor, each run of marks of these kinds in this order, inside one task, gives the
    intervals from the task's start to A, from A to B, ..., and from the last to the task's end;
    per interval the median, 10th and 90th percentiles and the sum over runs.

Times are µs after the file's first event. Each file is read on its own: the GPUs' clocks are
not aligned with each other.

usage: trace_report.py [--bin US] [--from US] [--to US] [--late N] [--phases A,B,...]
                       TRACE.json...
"""
import argparse
import json
import statistics
import sys

# Marks whose first value names a peer: (kind, how to read the peer from the value, label).
PEER_OF = {
    "ep_record_published": (lambda a: a, "to"),
    "ep_records_taken": (lambda a: a >> 24, "from"),
}
# Marks that stand for several records: how many, from the first value.
COUNT_OF = {
    "ep_records_taken": lambda a: a & 0xFFFFFF,
}


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X"]
    marks = [e for e in events if e.get("ph") == "i"]
    return tasks, marks


def late_records(marks, n, out):
    published = [m for m in marks if m["name"] == "ep_record_published"]
    for d in sorted({m["args"]["a"] for m in published}):
        ms = sorted((m for m in published if m["args"]["a"] == d), key=lambda m: m["ts"])
        out.write(f"  records published to {d}: {len(ms)}, the last {min(n, len(ms))}:"
                  + "".join(f" {m['args']['b']}@{m['ts']:.1f}us(p{m['tid']})" for m in ms[-n:])
                  + "\n")
    taken = [m for m in marks if m["name"] == "ep_records_taken"]
    for src in sorted({m["args"]["a"] >> 24 for m in taken}):
        ms = sorted((m for m in taken if m["args"]["a"] >> 24 == src), key=lambda m: m["ts"])
        out.write(f"  records taken from {src}, in runs (first+count@time):"
                  + "".join(f" {m['args']['b']}+{m['args']['a'] & 0xFFFFFF}@{m['ts']:.1f}us"
                            for m in ms) + "\n")


def phases(tasks, marks, kinds, out):
    track = lambda e: (e["pid"], e["tid"])
    marks_of, tasks_of = {}, {}
    for m in marks:
        marks_of.setdefault(track(m), []).append(m)
    for e in tasks:
        tasks_of.setdefault(track(e), []).append(e)
    names = ([f"task start>{kinds[0]}"] + [f"{a}>{b}" for a, b in zip(kinds, kinds[1:])] +
             [f"{kinds[-1]}>task end"])
    intervals = {n: [] for n in names}
    types = {}
    for t, ms in marks_of.items():
        ms.sort(key=lambda m: m["ts"])
        held = tasks_of.get(t, [])
        i = 0
        while i + len(kinds) <= len(ms):
            run = ms[i:i + len(kinds)]
            task = next((e for e in held
                         if e["ts"] <= run[0]["ts"] and run[-1]["ts"] <= e["ts"] + e["dur"]), None)
            if [m["name"] for m in run] != kinds or task is None:
                i += 1
                continue
            at = [task["ts"]] + [m["ts"] for m in run] + [task["ts"] + task["dur"]]
            for n, a, b in zip(names, at, at[1:]):
                intervals[n].append(b - a)
            types[task["name"]] = types.get(task["name"], 0) + 1
            i += len(kinds)
    runs = sum(types.values())
    out.write(f"  phases {','.join(kinds)}: {runs} runs" +
              "".join(f", {c} in {n}" for n, c in sorted(types.items())) + "\n")
    if not runs:
        return
    width = max(len(n) for n in names)
    out.write(f"    {'interval':<{width}} {'median':>8} {'p10':>8} {'p90':>8} {'sum':>10}\n")
    for n in names:
        v = sorted(intervals[n])
        out.write(f"    {n:<{width}} {statistics.median(v):>8.2f} {v[len(v) // 10]:>8.2f} "
                  f"{v[9 * len(v) // 10]:>8.2f} {sum(v):>10.1f}\n")


def report(path, bin_us, t_from, t_to, late, kinds, out):
    tasks, marks = load(path)
    if not tasks:
        out.write(f"== {path}: no tasks\n")
        return
    span = max(e["ts"] + e["dur"] for e in tasks)
    tracks = len({(e["pid"], e["tid"]) for e in tasks})
    out.write(f"== {path}: {len(tasks)} tasks on {tracks} processors over {span:.1f} us, "
              f"{len(marks)} marks\n")
    by_type = {}
    for e in tasks:
        by_type.setdefault(e["name"], []).append(e)
    names = sorted(by_type, key=lambda n: min(e["ts"] for e in by_type[n]))
    out.write(f"  {'type':<18} {'tasks':>6} {'first start':>12} {'last end':>10} "
              f"{'median':>8} {'busy':>9}\n")
    for n in names:
        l = by_type[n]
        out.write(f"  {n:<18} {len(l):>6} {min(e['ts'] for e in l):>9.1f} us "
                  f"{max(e['ts'] + e['dur'] for e in l):>7.1f} us "
                  f"{statistics.median(e['dur'] for e in l):>5.2f} us "
                  f"{sum(e['dur'] for e in l) / 1000:>6.2f} ms\n")

    lo = t_from if t_from is not None else 0.0
    hi = t_to if t_to is not None else span
    bins = []
    t = lo
    while t < hi:
        bins.append(t)
        t += bin_us
    out.write(f"  processors busy per {bin_us:g} us (average over the bin), by type, and idle:\n")
    out.write("  " + f"{'from us':>8}" + "".join(f" {n[:10]:>10}" for n in names) +
              f" {'idle':>7}\n")
    for b in bins:
        e_hi = b + bin_us
        busy = []
        for n in names:
            s = sum(max(0.0, min(e["ts"] + e["dur"], e_hi) - max(e["ts"], b)) for e in by_type[n])
            busy.append(s / bin_us)
        out.write("  " + f"{b:>8.1f}" + "".join(f" {x:>10.1f}" for x in busy) +
                  f" {max(0.0, tracks - sum(busy)):>7.1f}\n")

    if not marks:
        return
    if late:
        late_records(marks, late, out)
    if kinds:
        phases(tasks, marks, kinds, out)
    kinds = sorted({m["name"] for m in marks})
    for k in kinds:
        ms = [m for m in marks if m["name"] == k]
        count = COUNT_OF.get(k, lambda a: 1)
        peer, label = PEER_OF.get(k, (None, None))
        groups = sorted({peer(m["args"]["a"]) for m in ms}) if peer else [None]
        total = sum(count(m["args"]["a"]) for m in ms)
        out.write(f"  mark {k}: {len(ms)} marks ({total} records), per {bin_us:g} us"
                  + (f", by peer ({label})" if peer else "") + ":\n")
        out.write("  " + f"{'from us':>8}" +
                  "".join(f" {(label + ' ' + str(g)) if peer else 'all':>9}" for g in groups) +
                  "\n")
        for b in bins:
            row = []
            for g in groups:
                row.append(sum(count(m["args"]["a"]) for m in ms
                               if b <= m["ts"] < b + bin_us and (g is None or peer(m["args"]["a"]) == g)))
            if any(row):
                out.write("  " + f"{b:>8.1f}" + "".join(f" {x:>9}" for x in row) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE.json")
    p.add_argument("--bin", type=float, default=25.0, help="bin width in µs (default 25)")
    p.add_argument("--from", dest="t_from", type=float, help="first bin's start (µs)")
    p.add_argument("--to", dest="t_to", type=float, help="last bin's end (µs; default: the span)")
    p.add_argument("--late", type=int, default=0, metavar="N",
                   help="list the N records published last per destination, and the runs taken")
    p.add_argument("--phases", metavar="A,B,...",
                   help="the intervals between a task's start, its marks of these kinds in this "
                        "order, and its end")
    a = p.parse_args()
    if a.bin <= 0:
        p.error("--bin must be positive")
    kinds = a.phases.split(",") if a.phases else []
    if a.phases is not None and not all(kinds):
        p.error("--phases takes mark kinds separated by commas")
    for path in a.traces:
        try:
            report(path, a.bin, a.t_from, a.t_to, a.late, kinds, sys.stdout)
        except BrokenPipeError:
            return 0
        except (OSError, ValueError, KeyError) as e:
            print(f"trace_report.py: {path}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
