"""Deterministic rules: the rule table (``table``), tool results that report a failure
(``result_errors``), the tool definitions and calls found in a trace (``toolschema``) and the formats a
tool's schema states in words (``format_hints``)."""
