#!/usr/bin/env python3
"""bench_daemon.py: the arithmetic and the tables of tests/bench/bench_daemon.sh.

Subcommands (each reads files the shell script wrote, prints JSON or a table):

  stamp-run OUT ERR CMD.. run CMD, its stdout lines stamped with the time they
                          arrived into OUT, then its CPU seconds
  run-rate FILE           rates of one gpushare-run from stamp-run's OUT
  daemon-rate STATUS LOGS rates of one daemon job from `gpuctl --json status`
                          and `gpuctl --json logs` of it
  steps METRICS           steps of the running jobs, device seconds and steps of
                          the vdevs, from `gpuctl metrics`
  overhead FILE           the overhead table from the runs' JSON lines
  vdevs FILE              the four-vdevs table from its JSON lines

Rates, the same way on both sides, over epochs 2..N (epoch 1 pays for the
first touch of every buffer and, in the daemon, for loading the set):
  step_sps  samples / the time spent inside optimizer steps, as the runtime
            measures it (the per-epoch samples/s of gpushare-run and status);
  wall_sps  samples / wall time from the end of epoch 1 to the end of epoch
            N: everything between, the fair-share wait, the progress frames,
            the checkpoints and the control plane included.
"""
import json
import os
import re
import resource
import subprocess
import sys
import time


def stamp_run(out_path, err_path, *cmd):
    """Run cmd; its stdout lines go to out_path prefixed with the time they
    arrived, then a line "cpu_s X" with the CPU seconds it used."""
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in p.stdout:
            out.write("%.6f %s" % (time.time(), line))
        rc = p.wait()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.write("cpu_s %.3f\n" % (ru.ru_utime + ru.ru_stime))
    if rc:
        raise SystemExit("bench_daemon.py: %s exited %d" % (cmd[0], rc))


def rates(epochs):
    """epochs: [(epoch, end_time_s, samples, samples_per_second)] in order."""
    if len(epochs) < 2:
        raise SystemExit("bench_daemon.py: need at least 2 epochs to leave the first out, got %d"
                         % len(epochs))
    later = epochs[1:]
    samples = sum(e[2] for e in later)
    step_time = sum(e[2] / e[3] for e in later if e[3] > 0)
    wall = epochs[-1][1] - epochs[0][1]
    return {"epochs": len(epochs), "samples": samples,
            "step_sps": samples / step_time if step_time > 0 else 0.0,
            "wall_sps": samples / wall if wall > 0 else 0.0, "wall_s": wall}


def run_rate(path):
    head = re.compile(r"batch (\d+) x (\d+) accumulation.*\((\d+) per epoch\)")
    ep = re.compile(r"^epoch (\d+): .* ([0-9.]+) samples/s")
    per_epoch = None
    epochs = []
    cpu = None
    with open(path) as f:
        for line in f:
            t, _, text = line.partition(" ")
            if t == "cpu_s":
                cpu = float(text)
                continue
            m = head.search(text)
            if m:
                per_epoch = int(m.group(1)) * int(m.group(2)) * int(m.group(3))
            m = ep.match(text)
            if m:
                if per_epoch is None:
                    raise SystemExit("bench_daemon.py: %s: an epoch line before the job line" % path)
                epochs.append((int(m.group(1)), float(t), per_epoch, float(m.group(2))))
    r = rates(epochs)
    r["cpu_s"] = cpu
    print(json.dumps(r))


def daemon_rate(status_path, logs_path):
    with open(status_path) as f:
        job = json.load(f)["job"]
    if job.get("state") != "SUCCEEDED":
        raise SystemExit("bench_daemon.py: job %s ended %s: %s"
                         % (job.get("id"), job.get("state"), job.get("reason", "")))
    batch = job.get("micro_batch", 0) * job.get("accumulation_steps", 1)
    with open(logs_path) as f:
        events = json.load(f)["event"]
    epochs = []
    prev_step = 0
    for ev in events:
        end = ev.get("epoch_end")
        if not end:
            continue
        step = ev.get("step", 0)
        epochs.append((end["epoch"], ev["time_unix_ms"] / 1000.0, (step - prev_step) * batch,
                       float(end.get("samples_per_second", 0))))
        prev_step = step
    print(json.dumps(rates(epochs)))


def steps(path):
    """{"job": {id: step}, "vdev": {name: {"device_s": s, "steps": n}}}"""
    job = re.compile(r'^gpushare_job_step\{job="(\d+)".*\}\s+(\d+)\s*$')
    vdev = re.compile(r'^gpushare_vdev_(device_seconds|steps)_total\{vdev="([^"]*)".*\}\s+(\S+)\s*$')
    out = {"job": {}, "vdev": {}}
    with open(path) as f:
        for line in f:
            m = job.match(line)
            if m:
                out["job"][m.group(1)] = int(m.group(2))
            m = vdev.match(line)
            if m:
                v = out["vdev"].setdefault(m.group(2), {"device_s": 0.0, "steps": 0})
                if m.group(1) == "steps":
                    v["steps"] = int(m.group(3))
                else:
                    v["device_s"] = float(m.group(3))
    print(json.dumps(out))


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def overhead(path):
    runs = lines(path)
    print("%-6s %-8s %12s %12s %8s %8s" % ("round", "side", "step_sps", "wall_sps", "wall_s",
                                          "cpu_s"))
    for r in runs:
        print("%-6d %-8s %12.0f %12.0f %8.1f %8.1f" % (r["round"], r["side"], r["step_sps"],
                                                       r["wall_sps"], r["wall_s"], r["cpu_s"]))
    tot = {}
    for side in ("run", "daemon"):
        rs = [r for r in runs if r["side"] == side]
        samples = sum(r["samples"] for r in rs)
        tot[side] = {
            "step_sps": samples / sum(r["samples"] / r["step_sps"] for r in rs),
            "wall_sps": samples / sum(r["wall_s"] for r in rs),
            "cpu_s": sum(r["cpu_s"] for r in rs) / len(rs),
        }
    print()
    print("%-28s %12s %12s %10s" % ("all rounds", "gpushare-run", "gpushared", "overhead"))
    for k, what in (("wall_sps", "samples/s, wall clock"), ("step_sps", "samples/s, inside steps")):
        a, b = tot["run"][k], tot["daemon"][k]
        print("%-28s %12.0f %12.0f %9.2f%%" % (what, a, b, (a - b) / a * 100.0))
    a, b = tot["run"]["cpu_s"], tot["daemon"]["cpu_s"]
    print("%-28s %12.2f %12.2f %9.2f%%" % ("CPU seconds a job, whole", a, b, (b - a) / a * 100.0))
    # Each round runs the two sides back to back, so a round's pair shares
    # whatever else the machine was doing then; the median over the rounds
    # of each pair's overhead is the figure least moved by load that comes
    # and goes (a busy minute moves the totals above, not the median).
    pairs = []
    for rnd in sorted({r["round"] for r in runs}):
        side = {r["side"]: r for r in runs if r["round"] == rnd}
        if "run" in side and "daemon" in side and side["run"]["wall_sps"] > 0:
            a, b = side["run"]["wall_sps"], side["daemon"]["wall_sps"]
            pairs.append((a - b) / a * 100.0)
    if pairs:
        pairs.sort()
        med = median(pairs)
        print("%-28s %12s %12s %9.2f%%   (rounds: %s)" % (
            "median of the rounds' pairs", "", "", med, " ".join("%.1f" % x for x in pairs)))
    print("overhead = (gpushare-run - gpushared) / gpushare-run in samples/s (target: wall clock "
          "under 2%, read from the median of the pairs), (gpushared - gpushare-run) / "
          "gpushare-run in CPU seconds")
    print("CPU seconds: gpushare-run's process; the executor's and gpushared's from submit to the "
          "end (both from loading the set to exit, epoch 1 and the checkpoints included); less "
          "noisy than wall time on a shared machine")


def vdevs(path):
    rows = lines(path)
    ncpu = os.cpu_count() or 1
    print("%-6s %-26s %8s %8s %12s %10s %10s %7s" % ("round", "case", "steps", "seconds",
                                                   "samples/s", "cpu_ms/st", "dev_ms/st", "steal"))
    for r in rows:
        n = max(1, r["steps"])
        print("%-6d %-26s %8d %8.1f %12.0f %10.2f %10.2f %6.1f%%" % (
            r["round"], "one job, compute 100" if r["case"] == "single" else "four jobs, aggregate",
            r["steps"], r["seconds"], r["sps"], r["exec_cpu_s"] / n * 1e3, r["device_s"] / n * 1e3,
            r.get("steal_s", 0.0) / (r["seconds"] * ncpu) * 100.0 if r["seconds"] > 0 else 0.0))
        if r["case"] == "four":
            for j, s in sorted(r["per_job"].items(), key=lambda kv: int(kv[0])):
                print("%-6s %-26s %8d %8.1f %12.0f" % ("", "  job %s, compute 25" % j, s,
                                                       r["seconds"], s * r["batch"] / r["seconds"]))
    tot = {}
    for case in ("single", "four"):
        rs = [r for r in rows if r["case"] == case]
        steps = sum(r["steps"] for r in rs)
        tot[case] = {"sps": sum(r["steps"] * r["batch"] for r in rs) / sum(r["seconds"] for r in rs),
                     "cpu": sum(r["exec_cpu_s"] for r in rs) / max(1, steps),
                     "ctxsw": sum(r["exec_ctxsw"] for r in rs) / max(1, steps)}
    spreads = []
    for r in rows:
        if r["case"] == "four" and r["steps"]:
            per = list(r["per_job"].values())
            spreads.append((max(per) - min(per)) / (sum(per) / len(per)) * 100.0)
    s, f = tot["single"], tot["four"]
    print()
    print("aggregate / single, samples/s:               %6.1f%%  (target: at least 95%%)"
          % (f["sps"] / s["sps"] * 100.0))
    # As in overhead: a round's single and four run back to back and share
    # the machine's state of the moment, so the median of the rounds'
    # ratios is the figure a burst of other load (or steal) moves least.
    ratios = []
    for rnd in sorted({r["round"] for r in rows}):
        case = {r["case"]: r for r in rows if r["round"] == rnd}
        if "single" in case and "four" in case and case["single"]["sps"] > 0:
            ratios.append(case["four"]["sps"] / case["single"]["sps"] * 100.0)
    if ratios:
        print("aggregate / single, median of the rounds: %6.1f%%  (rounds: %s)" % (
            median(ratios), " ".join("%.1f" % x for x in sorted(ratios))))
    print("aggregate / single, by executor CPU per step: %6.1f%%  (%.2f ms against %.2f ms; less "
          "noisy on a shared machine)" % (s["cpu"] / f["cpu"] * 100.0 if f["cpu"] else 0.0,
                                          f["cpu"] * 1e3, s["cpu"] * 1e3))
    print("executor context switches per step: %.1f alone, %.1f with four; largest spread between "
          "the four jobs' steps: %.1f%% of their mean" % (s["ctxsw"], f["ctxsw"], max(spreads or [0])))
    print("steal: the share of all vCPUs the hypervisor ran something else on during the window; cpu_ms/st: the executor's CPU time (all its threads) per step; dev_ms/st: the "
          "core-seconds the steps' own threads used (vdev_device_seconds_total) per step")


def main(argv):
    cmds = {"stamp-run": (stamp_run, -1), "run-rate": (run_rate, 1), "daemon-rate": (daemon_rate, 2),
            "steps": (steps, 1), "overhead": (overhead, 1), "vdevs": (vdevs, 1)}
    if (len(argv) < 2 or argv[1] not in cmds or
            len(argv) - 2 != cmds[argv[1]][1] and not (cmds[argv[1]][1] < 0 and len(argv) > 4)):
        sys.stderr.write(__doc__)
        return 2
    cmds[argv[1]][0](*argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
