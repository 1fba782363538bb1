’
alice€£