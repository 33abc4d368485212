"""After a failure: triage of a job's logs and the report for a bug."""
