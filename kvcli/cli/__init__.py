"""The typer command line: thin; parses options, calls the library, prints. One module per command group.

May import anything in kvcli; nothing imports it.
"""
