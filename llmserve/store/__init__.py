"""The model store: packages pushed to S3-compatible object storage, pulled into a local fast cache."""
