//go:build !linux

package main

import "syscall"

// childAttr: without Linux's parent-death signal, publishers outlive a chaos run killed hard.
func childAttr() *syscall.SysProcAttr { return nil }
