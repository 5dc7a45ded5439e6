"""The host's messages to the child, checked key by key against what the host's types send
(`crates/runpython-core/src/child/protocol.rs`): a key missing or unknown is a `ProtocolError`, never a
default, so the two sides cannot drift apart silently. Standard library only, no imports at all.
"""

# A run's request (`RunnerRequest`): a one-shot run's, on stdin, and a session cell's.
RUN_REQUEST = frozenset(
    (
        "code_dir", "code", "inputs", "typed", "env", "trust_bundle", "input_artifacts", "files",
        "artifact_helpers", "network_reasons", "max_return_bytes", "inline_return_bytes", "image_budget", "site_dirs",
        "saved_dir", "repr", "bridge",
    )
)
TRUST_BUNDLE = frozenset(("path", "pem"))

# A session's control messages (`ControlMessage`), by their "type".
CONTROL = {
    "cell": RUN_REQUEST | {"type"},
    "interrupt": frozenset(("type",)),
    "snapshot": frozenset(("type", "max_bytes")),
    "restore": frozenset(("type", "site_dirs")),
}


class ProtocolError(Exception):
    """A message from the host that does not follow the protocol (runpython's fault, not the code's)."""


def checked(message, keys, what):
    """`message` if it is an object with exactly `keys`; else a ProtocolError naming the first difference."""
    if type(message) is not dict:
        raise ProtocolError("%s is not an object" % what)
    for key in sorted(keys):
        if key not in message:
            raise ProtocolError("%s: missing key %r" % (what, key))
    for key in message:
        if key not in keys:
            raise ProtocolError("%s: unknown key %r" % (what, key))
    return message


def run_request(message, keys=RUN_REQUEST, what="the run's request"):
    """A run's request, checked (with its trust bundle, when it has one)."""
    checked(message, keys, what)
    if message["trust_bundle"] is not None:
        checked(message["trust_bundle"], TRUST_BUNDLE, what + "'s trust bundle")
    return message


def control_message(message):
    """A session's control message, checked: a cell (a run's request with its "type"), an interrupt, a
    snapshot to take or one to load."""
    kind = message.get("type") if type(message) is dict else None
    keys = CONTROL.get(kind)
    if keys is None:
        raise ProtocolError("a session control message of unknown type %r" % (kind,))
    if kind == "cell":
        return run_request(message, keys, "a session cell's request")
    return checked(message, keys, "a session's %s message" % kind)
