"""The ``.pt`` capture file: its format, schema and metadata, and the trust check of files that
hold pickled objects.

Modules
-------
capture_file
    ``save_capture`` and ``load_capture``.
schema
    The schema a capture file is checked against when read.
meta
    The metadata schema (CaptureMeta) and the reader of version-1 files.
pickle_scan
    What a file that weights_only loading refuses would import, found without running it.
"""

__all__ = ["capture_file", "schema", "meta", "pickle_scan"]
