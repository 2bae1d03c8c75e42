"""The transports, one module each, behind one interface (`base.Transport`)."""
