"""The stand-in rendezvous store shared by tests/standins/bin/torchrun (its host) and the stand-in
``torch.distributed.TCPStore`` (its clients): a key-value store over TCP on the rendezvous endpoint,
one JSON object a line each way. Not the real TCPStore wire format (no test speaks that): the same
operations with the real ones' semantics (get and wait block until the key exists or the timeout;
compare_set sets a missing key when expected is empty, and returns the value in force).

The host also notes each agent that registers (``hello``) and sets ``<prefix>failed`` when one's
connection drops before it said it was done: a peer gone, as gloo's "Connection closed by peer".
"""

import json
import socket
import socketserver
import threading
import time


class _State:
    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()

    def wait_for(self, keys, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(k in self.data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
            return True


class _Handler(socketserver.StreamRequestHandler):
    def handle(self):
        st = self.server.state
        agent = None
        for raw in self.rfile:
            req = json.loads(raw)
            op, key = req.get("op"), req.get("key")
            reply = {"ok": True}
            with st.cond:
                if op == "set":
                    st.data[key] = req["value"]
                    st.cond.notify_all()
                elif op == "cas":
                    if key not in st.data and req["expected"] == "":
                        st.data[key] = req["desired"]
                        st.cond.notify_all()
                    elif st.data.get(key) == req["expected"]:
                        st.data[key] = req["desired"]
                        st.cond.notify_all()
                    reply["value"] = st.data.get(key, req["expected"])
                elif op == "add":
                    st.data[key] = str(int(st.data.get(key, "0")) + int(req["amount"]))
                    st.cond.notify_all()
                    reply["value"] = int(st.data[key])
                elif op == "check":
                    reply["value"] = all(k in st.data for k in req["keys"])
                elif op == "hello":
                    agent = req["prefix"]
                elif op == "bye":
                    agent = None
            if op in ("get", "wait"):
                keys = [key] if op == "get" else req["keys"]
                if not st.wait_for(keys, float(req.get("timeout", 300))):
                    reply = {"ok": False, "error": "timeout"}
                elif op == "get":
                    reply["value"] = st.data[key]
            self.wfile.write((json.dumps(reply) + "\n").encode())
            self.wfile.flush()
        if agent is not None:  # an agent's connection dropped before it was done: its peers see it gone
            with st.cond:
                st.data.setdefault(agent + "failed", json.dumps({"why": "peer connection closed"}))
                st.cond.notify_all()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(host, port):
    """Host the store on (host, port); OSError when the port is taken (another agent hosts it)."""
    server = _Server((host, port), _Handler)
    server.state = _State()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Client:
    """One connection to the store; every call is one request and its reply."""

    def __init__(self, host, port, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError("The client socket has timed out after %gs while trying to connect to (%s, %d)."
                                       % (timeout, host, port)) from exc
                time.sleep(0.1)
        self.sock.settimeout(None)
        self.file = self.sock.makefile("rwb")
        self.lock = threading.Lock()

    def call(self, **req):
        with self.lock:
            try:
                self.file.write((json.dumps(req) + "\n").encode())
                self.file.flush()
                raw = self.file.readline()
            except OSError as exc:
                raise RuntimeError("Connection reset by peer: %s" % exc) from exc
        if not raw:
            raise RuntimeError("Connection closed by peer")
        return json.loads(raw)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
