"""_take"""
