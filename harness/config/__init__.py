"""What a command is asked to do: its options (one declared model per command, read from flags,
TOML and Python), and the typed plan they resolve to before Ray starts. Light on purpose:
`harness --help` reads the options from here."""
