#!/usr/bin/env python3
"""A Troupe client in Python, built from proto/ with Debian's grpcio and protoc.

It authenticates with an API key, opens a session on the gateway's Chat stream, runs a turn in
which the agent calls a tool, steers a turn while its tools run, and aborts a turn while it
streams. Every step checks what the gateway sent back and the script exits non-zero if anything
is not as the protocol says.

    protoc -I proto --python_out=GEN --grpc_python_out=GEN \
      --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin proto/troupe/v1/*.proto
    PYTHONPATH=GEN TROUPE_API_KEY=... python3 examples/python/troupe_client.py [--gateway HOST:PORT]

(`make python-client` does the first line into .gen/python.)
"""
import argparse
import os
import queue
import sys
import uuid

import grpc

from troupe.v1 import gateway_pb2, gateway_pb2_grpc, session_pb2


class Session:
    """One Chat stream: frames go out through a queue, events come back in order."""

    def __init__(self, stub, api_key, session_id):
        self._out = queue.Queue()
        self._n = 0
        metadata = (("authorization", f"Bearer {api_key}"),)
        self._responses = stub.Chat(iter(self._out.get, None), metadata=metadata)
        self.send(open=session_pb2.OpenSession(session_id=session_id, create=True))
        first = next(self._responses)
        if first.WhichOneof("kind") != "opened":
            raise AssertionError(f"expected the open answer first, got {first}")
        self.opened = first.opened

    def send(self, **kind):
        self._n += 1
        frame_id = f"py-{self._n}-{uuid.uuid4().hex[:8]}"
        self._out.put(gateway_pb2.ChatRequest(frame=session_pb2.ClientFrame(frame_id=frame_id, **kind)))
        return frame_id

    def events(self):
        for resp in self._responses:
            if resp.WhichOneof("kind") == "event":
                yield resp.event

    def until_end(self, on_event=None):
        """Events up to and including the next agent_end (on_event sees each as it comes)."""
        seen = []
        for ev in self.events():
            seen.append(ev)
            if on_event:
                on_event(ev)
            if ev.WhichOneof("payload") == "agent_end":
                return seen
        raise AssertionError("the stream ended before the run did")

    def close(self):
        self._out.put(None)


class SendOnce:
    """An event callback that sends one frame when the first event of a kind arrives."""

    def __init__(self, session, payload, **frame):
        self.session, self.payload, self.frame, self.frame_id = session, payload, frame, None

    def __call__(self, ev):
        if self.frame_id is None and ev.WhichOneof("payload") == self.payload:
            self.frame_id = self.session.send(**self.frame)


def kinds(events):
    return [ev.WhichOneof("payload") for ev in events]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default=os.environ.get("TROUPE_GATEWAY_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--session", default=f"python-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--ca", help="a gateway serving TLS: trust this CA certificate (PEM)")
    parser.add_argument("--tls", action="store_true", help="a gateway serving TLS: trust the system's CAs")
    args = parser.parse_args()
    api_key = os.environ.get("TROUPE_API_KEY")
    if not api_key:
        sys.exit("set TROUPE_API_KEY (troupe up prints a development key)")

    options = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
    if args.ca or args.tls:
        roots = open(args.ca, "rb").read() if args.ca else None
        channel = grpc.secure_channel(args.gateway, grpc.ssl_channel_credentials(root_certificates=roots), options=options)
    else:
        channel = grpc.insecure_channel(args.gateway, options=options)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)

    # A wrong key is refused before anything happens.
    try:
        list(stub.ListSessions(gateway_pb2.ListSessionsRequest(), metadata=(("authorization", "Bearer wrong"),)).sessions)
        raise AssertionError("an unknown key was accepted")
    except grpc.RpcError as err:
        check(err.code() == grpc.StatusCode.UNAUTHENTICATED, f"unknown key: expected UNAUTHENTICATED, got {err.code()}")
    print("unknown key: UNAUTHENTICATED")

    s = Session(stub, api_key, args.session)
    print(f"opened {s.opened.session_id} (created={s.opened.created})")

    # 1. A turn with a tool call: the scripted model runs `$ CMD` through the exec tool.
    s.send(prompt=session_pb2.Prompt(text="$ echo hello from python"))
    events = s.until_end()
    ks = kinds(events)
    check("tool_execution_start" in ks and "tool_execution_end" in ks, f"no tool call in {ks}")
    tool_end = next(ev.tool_execution_end for ev in events if ev.WhichOneof("payload") == "tool_execution_end")
    check(not tool_end.is_error and "hello from python" in tool_end.result, f"tool result: {tool_end}")
    seqs = [ev.seq for ev in events]
    check(seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"seq has gaps: {seqs}")
    check(events[-1].agent_end.stop_reason == session_pb2.STOP_REASON_COMPLETED, "the turn did not complete")
    print(f"turn with a tool call: {len(events)} events, tool said {tool_end.result.splitlines()[0]!r}")

    # 2. Steering: sent while the first of three tool calls runs; the other two are skipped and
    #    the steering message is applied before the next model call.
    s.send(prompt=session_pb2.Prompt(text="$$ sleep 1 ;; echo second ;; echo third"))
    steer = SendOnce(s, "tool_execution_start", steer=session_pb2.Steer(text="stop, do something else"))
    events = s.until_end(steer)
    steer_id = steer.frame_id
    ks = kinds(events)
    skipped = [ev.tool_calls_skipped for ev in events if ev.WhichOneof("payload") == "tool_calls_skipped"]
    check(skipped and len(skipped[0].tool_call_ids) == 2, f"expected two skipped tool calls, got {skipped}")
    applied = [ev.queue_applied.frame_id for ev in events if ev.WhichOneof("payload") == "queue_applied"]
    check(steer_id in applied, f"the steer {steer_id} was not applied: {applied}")
    print(f"steering: {len(skipped[0].tool_call_ids)} tool calls skipped, steer applied")

    # 3. Abort while the reply streams.
    s.send(prompt=session_pb2.Prompt(text="!tokens 2000 rate=100"))
    events = s.until_end(SendOnce(s, "message_update", abort=session_pb2.Abort(reason="python says stop")))
    check(events[-1].agent_end.stop_reason == session_pb2.STOP_REASON_ABORTED, f"stop reason {events[-1].agent_end.stop_reason}")
    print("abort while streaming: the run ended with stop reason aborted")

    s.close()
    channel.close()
    print("OK")


if __name__ == "__main__":
    main()
