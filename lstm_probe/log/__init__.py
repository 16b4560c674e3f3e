"""The log layer: the declared schema, the writer (thread or process), the crash journal and parts, the
bounded reader of hostile files. Never imports torch on the read side."""
