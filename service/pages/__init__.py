"""Pages for people, under /ui/: a model's facts, a stay's risk and why, live monitoring.

Server-rendered HTML with inline SVG drawn by `svg`; one small script (the stay form) and one
style sheet, both served by the service; a strict Content-Security-Policy (`render.CSP`).
"""
