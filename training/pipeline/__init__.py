"""The product's jobs as stages (generate, ingest, sequences, train, score, demo) and the nightly job."""
