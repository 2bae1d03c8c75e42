"""What both ends of a transport agree on: the pipe protocol, the shared memory layout, infos.

Imported by the driver and by the workers; nothing here imports the driver side.
"""
