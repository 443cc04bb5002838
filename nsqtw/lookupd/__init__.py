"""lookupd"""
