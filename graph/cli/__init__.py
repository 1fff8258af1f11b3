"""The command line: commands (main), flags (args), console output (console), run stores (store), export."""
