// The calls a server has under way, so that its shutdown can end them. grpc-js 1.14's
// forceShutdown destroys only the HTTP/2 sessions it tracks for channelz, and limits.ts turns
// channelz off: so it left every running call (a gateway's AttachMany, a watcher's Subscribe)
// open, and its connection with it, until the process exited. RpcServer.close ends each with a
// status of our own, whatever grpc-js tracks.
import { Status } from "../errors.js";
import * as grpc from "@grpc/grpc-js";

export class LiveCalls {
  private readonly calls = new Set<grpc.ServerInterceptingCall>();

  /** The interceptor that keeps the set: a call is in it from its start until its status or cancel. */
  readonly interceptor: grpc.ServerInterceptor = (_method, call) => {
    const live: grpc.ServerInterceptingCall = new grpc.ServerInterceptingCall(call, {
      start: (next) => next({ onCancel: () => this.calls.delete(live) }),
      sendStatus: (status, next) => {
        this.calls.delete(live);
        next(status);
      },
    });
    this.calls.add(live);
    return live;
  };

  /** Ends every call still under way with UNAVAILABLE: the client retries elsewhere. */
  endAll(details: string): void {
    for (const call of [...this.calls]) {
      this.calls.delete(call);
      call.sendStatus({ code: Status.UNAVAILABLE, details, metadata: new grpc.Metadata() });
    }
  }
}
