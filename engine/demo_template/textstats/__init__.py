"""textstats: small text statistics (word counts, most frequent words)."""
