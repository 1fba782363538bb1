r
alice 