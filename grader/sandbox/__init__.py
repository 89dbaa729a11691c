"""The sandboxed worker: the zygote that imports torch once and the children that run candidate code.

Nothing here is imported as part of the grader when a grade runs: the grader starts worker.py by path
(`python -I -u worker.py CONTROL_FD WIRE_PY`), and the worker loads this folder's other modules by path
under private names. The package exists so the files ship with the kit, and so tests can reach a constant.
"""
