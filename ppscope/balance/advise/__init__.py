"""The split search and the advice: the exact min-max layer split, the interval on its predicted speedup, and
the rule that says to keep a split when the gain is noise."""
