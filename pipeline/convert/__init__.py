"""OTLP -> Arrow span rows: the ``records`` facade and its decoders below it."""
