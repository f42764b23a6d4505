"""A control channel that holds every group capability its calls were given, as a graphfeed client does.

Tests that call the Control service by hand (``OpenGroup`` then ``OpenSession``, ``Heartbeat``, ...)
wrap their channel with :func:`holding_capabilities`: each ``OpenGroupReply.group_capability`` is kept
and sent (``graphfeed-group-capability-bin`` metadata) on every later call of that channel, so the
calls act as the trainer that opened the groups.  A plain channel is another job.
"""
from __future__ import annotations

import collections

import grpc

from graphfeed.server.daemon.security import CAPABILITY_HEADER


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class CapabilityKeeper(grpc.UnaryUnaryClientInterceptor):
    def __init__(self):
        self.held: list[bytes] = []

    def intercept_unary_unary(self, continuation, details, request):
        metadata = [*(details.metadata or ()), *((CAPABILITY_HEADER, c) for c in self.held)]
        call = continuation(_Details(details.method, details.timeout, metadata, details.credentials,
                                     details.wait_for_ready, details.compression), request)
        if details.method.endswith("/OpenGroup"):
            try:
                capability = bytes(call.result().group_capability)
            except grpc.RpcError:
                return call
            if capability:
                self.held.append(capability)
        return call


def holding_capabilities(channel: grpc.Channel) -> grpc.Channel:
    """``channel`` whose calls carry every capability its own OpenGroup calls returned."""
    return grpc.intercept_channel(channel, CapabilityKeeper())
