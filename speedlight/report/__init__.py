"""Renders the JSON results of the tools into one page (index.html) and summary.md.

It reads the files a report folder holds and nothing else: every number it shows comes
from a stage file it links to.
"""
