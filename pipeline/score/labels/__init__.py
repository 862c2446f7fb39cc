"""Human labels: importing them as ``source = 'human'`` step scores (``human``), their agreement
with the automatic scores (``agreement``) and its report (``report``)."""
