"""The storage layer of StorageFault: a FUSE passthrough mounted over exactly the job's
checkpoint folder, which fails, holds or delays the file operations a fault names.

``wire`` (the modes and the pipes' one-line JSON), ``fs`` (the layer itself, a process of
its own: the only module that imports ``mfusepy``), ``layer`` (the drill's side: mount,
arm, lift, audit, unmount, the owner record) and ``sweep`` (what a SIGKILLed drill left).
docs/faults.md says which mechanism each mode uses and why.
"""

__all__: list[str] = []
