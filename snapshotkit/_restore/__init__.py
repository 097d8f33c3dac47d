"""_restore"""
