"""_plan"""
