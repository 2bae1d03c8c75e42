"""The transports behind one interface (`base.Transport`): Ray calls, channels, in-process."""
