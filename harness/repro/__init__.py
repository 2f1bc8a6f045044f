"""`harness repro RUN_ID`: a failing check as a folder a vendor runs without the harness (folder.py
makes it; script.py is the script it holds)."""
