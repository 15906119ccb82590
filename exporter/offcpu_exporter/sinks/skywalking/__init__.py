"""SkyWalking output: off-CPU `EBPFProfilingData` to a file, to an OAP task, or as a Rover-like agent.

Modes (any of them together):
- ``--skywalking.file PATH``: every flush appends length-delimited messages to PATH
  (``offcpu-exporter skywalking-dump PATH`` prints them).
- ``--skywalking.endpoint HOST:PORT --skywalking.task-id T --skywalking.process-id P``: every flush
  is streamed to the OAP's ``collectProfilingData`` under that task.
- ``--skywalking.endpoint HOST:PORT --skywalking.agent``: the watched processes are reported to the
  OAP, and data is streamed for the OFF_CPU tasks the OAP creates for them.

`options` holds the flags and is all the CLI imports to build its parser; `sink` (gRPC and the
SkyWalking gencode) is imported only when the options turn it on.
"""
