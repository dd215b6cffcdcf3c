"""The sandbox host's errors: its own failures (SandboxError) and what goes wrong on a runner's channel."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (no engine, no image, a runner that cannot start) - never the code's doing."""


class ChannelClosed(Exception):
    """The runner went away (its container or process ended)."""


class ChannelTimeout(Exception):
    """The runner did not answer in time."""


class ProtocolError(Exception):
    """A reply the runner never sends: malformed, too large, or failing its signature. Only code that broke
    into the channel (possible under gVisor) or a broken runner produces one."""


class ResetFailed(Exception):
    """The runner could not make itself clean between sessions (something of the code was left)."""
