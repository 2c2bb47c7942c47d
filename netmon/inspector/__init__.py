"""The jobs' own collectives, read from NVIDIA NCCL Inspector's files (docs/INSPECTOR.md): the
`inspector:` settings (settings.py), one collective in netmon's terms (records.py), the plugin's
textfile dumps and JSON lines (promfile.py, jsonlines.py), the files read without trusting them
(files.py), and the shapes they are summed into (shapes.py). The daemon's side is
netmon.serve.jobs_traffic and netmon.serve.jobs_record."""
