"""The release format in one place: file names and row order (format), the manifest (manifest), the
atomic writer (writer) and the reader (reader)."""
