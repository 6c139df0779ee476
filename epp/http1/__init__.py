"""EPP's HTTP/1.1 wire layer on llhttp (``httptools``): request parsing for the gateway's server, response parsing
for the upstream proxy client and the metrics scraper. Import from the submodules; this package re-exports nothing.
"""
