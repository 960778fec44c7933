#!/usr/bin/env python3
"""The fault suite: a real `moeshard up` cluster of the demo model (2 CPU workers, loopback),
faults injected with signals under streaming load, and the outcomes issue 16 asks for.

Per mode (tensor-parallel, layer-split):
  worker SIGKILL  8 greedy streams mid-way and 40 queued requests: every stream completes with
                  exactly the text of an undisturbed run, the queued ones get 200 (identical
                  text) or 503 + Retry-After and nothing else; /ready is 200 again within 60 s.
  worker SIGSTOP  /ready turns 503 within 10 s; every stream completes, identically, within 30 s.
  burst           past the queue bound: 503 + Retry-After, answered at once (p90 < 1 s; latency printed).
Then, in tensor parallel only: coordinator SIGKILL (streams complete identically), router SIGKILL
(`up` restarts it on the same port), and a model whose weights do not match its config (`up`
exits non-zero with the reason within 60 s).

One line per check ("ok: ..." / "FAIL: ..."), the figures as "figure: ...", then a summary.
Usage: fault_test.py --build BUILD [--model DIR] [--modes tensor-parallel,layer-split]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster, ReadyWatch, post, run_parallel  # noqa: E402

PROMPTS = ["In the beginning", "And the LORD said unto Moses", "Blessed are the", "The king of Babylon",
           "And it came to pass", "Hear, O Israel", "For God so loved", "The words of the preacher"]
STREAM_TOKENS, QUEUED_TOKENS = 96, 24
# Small bounds so that the scenarios queue and refuse on a 2-core machine; a short step-deadline
# floor so that a hang is noticed in about a second.
CLUSTER_FLAGS = ["--max-num-seqs", "8", "--max-queued-requests", "48", "--max-queue-time-s", "120",
                 "--step-deadline-floor-ms", "1000"]

passed, failed = 0, 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok: {what}", flush=True)
    else:
        failed += 1
        print(f"FAIL: {what}{': ' + detail if detail else ''}", flush=True)


def figure(text):
    print(f"figure: {text}", flush=True)


def body(prompt, max_tokens, stream):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def baseline(cluster):
    """The greedy outputs of an undisturbed run, one request at a time."""
    out = {}
    for p in PROMPTS:
        for n in (STREAM_TOKENS, QUEUED_TOKENS):
            r = post(cluster, body(p, n, False))
            if r["status"] != 200:
                raise RuntimeError(f"baseline request failed: {r}")
            out[(p, n)] = r["text"]
    return out


def wait_streaming(results, min_events, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r["events"] >= min_events or r["t_end"] for r in results):
            return True
        time.sleep(0.01)
    return False


def join(threads, timeout_s):
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def streams_identical(what, results, base, n):
    bad = [(i, r["status"], r["error"], r["text"][:40]) for i, r in enumerate(results)
           if r["status"] != 200 or r["error"] or r["text"] != base[(PROMPTS[i], n)]]
    check(not bad, f"{what}: all {len(results)} greedy streams complete with the undisturbed text",
          f"{len(bad)} differ or failed: {bad[:3]}")
    return len(results) - len(bad)


def fault_under_load(cluster, mode, base, kind, pid, sig):
    """Streams mid-way (and, for a worker kill, 40 queued requests); then the signal."""
    streams, st_results = run_parallel(cluster, [body(p, STREAM_TOKENS, True) for p in PROMPTS])
    check(wait_streaming(st_results, 3), f"{mode} {kind}: streams started")
    queued, q_results = [], []
    if kind == "worker SIGKILL":
        queued, q_results = run_parallel(cluster, [body(PROMPTS[i % 8], QUEUED_TOKENS, False) for i in range(40)],
                                         stagger_s=0.005)
        time.sleep(0.2)
    watch = ReadyWatch(cluster).start()
    t_fault = time.monotonic()
    os.kill(pid, sig)
    done = join(streams + queued, 90)
    deadline = time.monotonic() + 60
    while watch.t_up is None and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    check(done, f"{mode} {kind}: every request ended")
    identical = streams_identical(f"{mode} {kind}", st_results, base, STREAM_TOKENS)
    detect = None if watch.t_down is None else watch.t_down - t_fault
    ready = None if watch.t_up is None else watch.t_up - t_fault
    last_stream = max((r["t_end"] or float("inf")) for r in st_results) - t_fault
    figure(f"{mode} {kind}: /ready 503 after {detect if detect is None else round(detect, 2)} s, ready again after "
           f"{ready if ready is None else round(ready, 2)} s, last stream done {last_stream:.2f} s after the fault; "
           f"streams identical {identical}/{len(st_results)}")
    check(ready is not None and ready <= 60, f"{mode} {kind}: ready again within 60 s", f"{ready}")
    if kind == "worker SIGSTOP":
        check(detect is not None and detect <= 10, f"{mode} {kind}: /ready 503 within 10 s", f"{detect}")
        check(last_stream <= 30, f"{mode} {kind}: every stream completes within 30 s", f"{last_stream:.1f} s")
    if q_results:
        ok200 = sum(1 for i, r in enumerate(q_results)
                    if r["status"] == 200 and r["text"] == base[(PROMPTS[i % 8], QUEUED_TOKENS)])
        ok503 = sum(1 for r in q_results if r["status"] == 503 and r["retry_after"])
        other = [(r["status"], r["error"]) for r in q_results if r["status"] not in (200, 503)]
        why = sorted({r["error"] for r in q_results if r["status"] == 503})[:2]
        figure(f"{mode} {kind}: queued requests 200-identical {ok200}, 503+Retry-After {ok503} {why}, other {len(other)}")
        check(ok200 + ok503 == len(q_results) and not other,
              f"{mode} {kind}: the 40 queued requests get 200 (identical) or 503 + Retry-After, no other 5xx",
              f"{other[:3]}")


def burst(cluster, mode):
    """Fills the coordinator (8 running + 48 queued), then sends 30 more from 6 clients.

    The fill's requests are long (240 tokens) and the burst follows 0.2 s after the last is sent, so
    that no running request has finished — and freed a queue slot — before the burst arrives, however
    fast the machine decodes (with 96 tokens and 0.5 s, a fast run freed enough slots to queue the
    whole burst: 0 refused, 2026-12-05). The fill streams, and its clients leave once the burst has
    its answers: the router cancels a stream whose client has gone at its next event, so the fill
    ends in a step or two a wave instead of 56 x 240 tokens (~20 s here); a short request then shows
    the capacity came back."""
    leave = threading.Event()
    fill, fill_results = run_parallel(cluster, [body(PROMPTS[i % 8], 240, True) for i in range(56)], stagger_s=0.005,
                                      leave=leave)
    time.sleep(0.2)
    burst_results = [[] for _ in range(6)]

    def client(k):
        for _ in range(5):
            burst_results[k].append(post(cluster, body(PROMPTS[k], 48, False)))

    clients = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(120)
    leave.set()
    t0 = time.monotonic()
    join(fill, 180)
    left = sum(r["left"] for r in fill_results)
    after = post(cluster, body(PROMPTS[0], 8, False), timeout_s=60)
    figure(f"{mode} burst: {left} of 56 fill streams left early; their clients gone and a new request answered "
           f"{time.monotonic() - t0:.1f} s after the burst")
    check(after["status"] == 200, f"{mode} burst: after the fill's clients leave, a new request is served",
          f"{after['status']} {after['error']}")
    results = [r for rs in burst_results for r in rs]
    refused = [r for r in results if r["status"] == 503]
    other = [(r["status"], r["error"]) for r in results + fill_results if r["status"] not in (200, 503)]
    check(len(refused) > 0 and all(r["retry_after"] for r in refused),
          f"{mode} burst past the bound (8 running + 48 queued, then 30 more): 503 + Retry-After",
          f"{len(refused)} refused")
    check(not other, f"{mode} burst: only 200 and 503", f"{other[:3]}")
    if refused:
        ms = sorted(r["seconds"] * 1000 for r in refused)
        p50, p90 = statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]
        figure(f"{mode} burst: {len(results) - len(refused)} of 30 served, {len(refused)} refused; refusal latency "
               f"p50 {p50:.1f} ms, p90 {p90:.1f} ms, max {ms[-1]:.1f} ms (client side)")
        # At once, not after a wait for a slot: a request that queued would wait for the fill's
        # streams (tens of seconds). The bound is not a latency target (the figure above is the
        # measurement; 50 ms failed on a loaded 2-core CI machine at 62.7 ms).
        check(p90 < 1000, f"{mode} burst: refusals answer at once, not after a slot (p90 < 1 s)", f"{p90:.1f} ms")


def bad_model(args, tmp):
    broken = os.path.join(tmp, "bad-model")
    shutil.copytree(args.model, broken)
    with open(os.path.join(broken, "config.json")) as f:
        config = json.load(f)
    config["moe_latent_size"] = config["moe_latent_size"] * 2  # the weights no longer fit
    with open(os.path.join(broken, "config.json"), "w") as f:
        json.dump(config, f)
    t0 = time.monotonic()
    try:
        Cluster(args.build, broken, ["--workers", "2", "--mode", "tensor-parallel"], os.path.join(tmp, "bad.log"), 90)
        check(False, "up with a bad model fails", "it became ready")
        return
    except RuntimeError:
        pass
    took = time.monotonic() - t0
    with open(os.path.join(tmp, "bad.log")) as f:
        log = f.read()
    figure(f"bad model: up exited after {took:.1f} s")
    check(took <= 60 and "before the cluster was ready" in log and "refused" in log,
          "up with weights that do not match the config exits within 60 s with the reason", log[-300:])


def run_mode(args, mode, tmp):
    c = Cluster(args.build, args.model, ["--workers", "2", "--mode", mode] + CLUSTER_FLAGS,
                os.path.join(tmp, f"{mode}.log"))
    try:
        base = baseline(c)
        workers = c.children("moeshard-worker")
        check(len(workers) == 2, f"{mode}: two workers found", f"{workers}")
        fault_under_load(c, mode, base, "worker SIGKILL", c.children("moeshard-worker")[1], signal.SIGKILL)
        fault_under_load(c, mode, base, "worker SIGSTOP", c.children("moeshard-worker")[0], signal.SIGSTOP)
        burst(c, mode)
        if mode == "tensor-parallel":
            fault_under_load(c, mode, base, "coordinator SIGKILL", c.children("moeshard-coordinator")[0],
                             signal.SIGKILL)
            watch = ReadyWatch(c).start()
            t0 = time.monotonic()
            os.kill(c.children("moeshard-router")[0], signal.SIGKILL)
            while watch.t_up is None and time.monotonic() - t0 < 60:
                time.sleep(0.05)
            watch.stop()
            up = None if watch.t_up is None else watch.t_up - t0
            figure(f"{mode} router SIGKILL: ready again on the same port after {up if up is None else round(up, 2)} s")
            check(up is not None and up <= 30, f"{mode} router SIGKILL: restarted, /ready 200 on the same port", f"{up}")
            r = post(c, body(PROMPTS[0], QUEUED_TOKENS, False))
            check(r["status"] == 200 and r["text"] == base[(PROMPTS[0], QUEUED_TOKENS)],
                  f"{mode} router SIGKILL: serves the same text afterwards", f"{r}")
        check(c.proc.poll() is None, f"{mode}: up still runs after every fault")
    finally:
        c.stop()
        if failed:
            with open(os.path.join(tmp, f"{mode}.log")) as f:
                print(f"--- last lines of the {mode} cluster's log:\n" + "".join(f.readlines()[-40:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", default="models/muse-spark-demo")
    ap.add_argument("--modes", default="tensor-parallel,layer-split")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="moeshard-fault-") as tmp:
        for mode in args.modes.split(","):
            run_mode(args, mode, tmp)
        bad_model(args, tmp)
    print(f"{passed} passed, {failed} failed ({time.monotonic() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
