"""A `moeshard up` cluster for the fault suite, and the HTTP clients it drives it with.

Cluster starts `moeshard up` in its own process group on free loopback ports, waits for
"moeshard up: ready", finds its children by parent pid (never by name alone), and stops it
with SIGTERM (the process group is the safety net). The clients speak the OpenAI API the way
users do: one POST per request, SSE for streams, and record status, text and timings.
"""
import http.client
import json
import os
import queue
import signal
import subprocess
import threading
import time
import urllib.parse


class Cluster:
    def __init__(self, build, model, args, log_path, ready_timeout_s=120):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(build, "moeshard"), "up", "--model", model, "--port", "0"] + args,
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = None
        deadline = time.monotonic() + ready_timeout_s
        while True:
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                raise RuntimeError(f"moeshard up did not get ready (log: {log_path})")
            if line.startswith("moeshard up: http://"):
                self.url = line.split()[2]
            if line.strip() == "moeshard up: ready":
                break
        parsed = urllib.parse.urlparse(self.url)
        self.host, self.port = parsed.hostname, parsed.port

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout_s):
        try:
            return self.lines.get(timeout=max(0.01, timeout_s))
        except queue.Empty:
            return None

    def children(self, name):
        """Pids of up's children running `name`, in start order (oldest first)."""
        out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(self.proc.pid), "--sort=start_time"],
                             capture_output=True, text=True).stdout.split("\n")
        # args, not comm: comm is cut at 15 characters ("moeshard-coordi").
        return [int(l.split()[0]) for l in out if len(l.split()) > 1 and os.path.basename(l.split()[1]) == name]

    def ready_status(self, timeout_s=1.0):
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
            c.request("GET", "/ready")
            status = c.getresponse().status
            c.close()
            return status
        except OSError:
            return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


class ReadyWatch:
    """Polls /ready every 50 ms from start() on: when it first left 200, when it came back."""

    def __init__(self, cluster):
        self.cluster, self.t_down, self.t_up, self.reason = cluster, None, None, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            status = self.cluster.ready_status()
            now = time.monotonic()
            if status != 200 and self.t_down is None:
                self.t_down = now
            if status == 200 and self.t_down is not None and self.t_up is None:
                self.t_up = now
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()


def new_result():
    return {"status": 0, "text": "", "error": None, "retry_after": None, "events": 0, "first_token_s": None,
            "t_end": None, "left": False}


def post(cluster, body, r=None, timeout_s=120, leave=None):
    """One request, filling `r` as it goes (events grows while a stream runs): status, text,
    error, retry_after, seconds, first_token_s, t_end. A stream stops reading and closes its
    connection at the first event after `leave` (a threading.Event) is set: r["left"] is True."""
    r = new_result() if r is None else r
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection(cluster.host, cluster.port, timeout=timeout_s)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        res = c.getresponse()
        r["status"], r["retry_after"] = res.status, res.getheader("Retry-After")
        if res.status == 200 and body.get("stream"):
            for raw in res:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    r["error"] = event["error"].get("message", "error")
                    continue
                text = event["choices"][0].get("text", "")
                if text and r["first_token_s"] is None:
                    r["first_token_s"] = time.monotonic() - t0
                r["text"] += text
                r["events"] += 1
                if leave is not None and leave.is_set():
                    r["left"] = True
                    break
        else:
            payload = json.loads(res.read() or b"{}")
            if res.status == 200:
                r["text"] = payload["choices"][0]["text"]
            else:
                r["error"] = payload.get("error", {}).get("message", "")
        c.close()
    except (OSError, ValueError) as e:
        r["error"] = f"{type(e).__name__}: {e}"
    r["seconds"] = time.monotonic() - t0
    r["t_end"] = time.monotonic()
    return r


def run_parallel(cluster, bodies, stagger_s=0.0, leave=None):
    """Starts one thread per body, `stagger_s` apart (the router's listen backlog is small: many
    connects in the same instant get resets); returns (threads, results) to join later. `leave`:
    as post's."""
    results = [new_result() for _ in bodies]

    def one(i):
        post(cluster, bodies[i], results[i], leave=leave)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    return threads, results
