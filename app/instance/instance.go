// Package instance keeps one contributor app per data folder: the first
// process holds an exclusive lock on DIR/instance.lock for its lifetime
// and listens on a loopback port (written with a random token to
// DIR/instance.json, mode 0600); a second launch on the same folder finds
// the lock taken, asks the first to bring its window to the front, and
// exits with a message instead of opening a second wallet and worker. The
// lock is released by the OS when the process ends, so a crash leaves
// nothing to clean up. It does not import Fyne.
package instance

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/engine/fslock"
)

// ExitRunning is the exit code of a second launch on a data folder another
// instance holds (the app's window and `kvasir --headless` alike).
const ExitRunning = 3

// ErrRunning is wrapped by Acquire's error when another process holds the
// data folder.
var ErrRunning = errors.New("kvasir is already running")

// ErrLock is wrapped by Acquire's error when the lock file cannot be made
// or locked for another reason than a running instance.
var ErrLock = errors.New("instance: cannot lock the data folder")

// Files in the data folder.
const (
	LockFile = "instance.lock" // held locked by the running instance; holds its pid
	InfoFile = "instance.json" // {"pid", "addr", "token"} of the running instance
)

type info struct {
	PID   int    `json:"pid"`
	Addr  string `json:"addr"`
	Token string `json:"token"`
}

// Lock is the data folder held by this process. Release frees it.
type Lock struct {
	dir   string
	f     *os.File
	ln    net.Listener
	token string
	wg    sync.WaitGroup
}

// Acquire makes dir (0700) and takes its lock. onShow (may be nil) is
// called, on its own goroutine, each time a later launch asks this
// instance to show its window. When another process holds the lock,
// Acquire asks it to show its window and returns an error wrapping
// ErrRunning that names the folder and the process and says whether it
// answered.
func Acquire(dir string, onShow func()) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrLock, dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrLock, dir, err)
	}
	held, err := fslock.TryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w %s: %v", ErrLock, dir, err)
	}
	if !held {
		f.Close()
		return nil, showOther(dir)
	}
	l := &Lock{dir: dir, f: f}
	if err := l.serve(onShow); err != nil {
		l.Release()
		return nil, fmt.Errorf("%w %s: %v", ErrLock, dir, err)
	}
	return l, nil
}

// serve listens on loopback and publishes the address; l.f is locked.
func (l *Lock) serve(onShow func()) error {
	_ = l.f.Truncate(0)
	if _, err := l.f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0); err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	l.token = hex.EncodeToString(tok)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	l.ln = ln
	b, _ := json.Marshal(info{PID: os.Getpid(), Addr: ln.Addr().String(), Token: l.token})
	tmp := filepath.Join(l.dir, InfoFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(l.dir, InfoFile)); err != nil {
		return err
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil || strings.TrimSpace(line) != "show "+l.token {
					fmt.Fprintln(c, "denied")
					return
				}
				// Shown before the answer: a second launch that reads "ok"
				// knows the window was asked to come forward.
				if onShow == nil {
					fmt.Fprintln(c, "headless") // no window to show
					return
				}
				onShow()
				fmt.Fprintln(c, "ok")
			}()
		}
	}()
	return nil
}

// showOther asks the instance holding dir to show its window.
func showOther(dir string) error {
	var in info
	var err error
	for i := 0; i < 20; i++ { // the holder writes instance.json right after locking
		var b []byte
		if b, err = os.ReadFile(filepath.Join(dir, InfoFile)); err == nil {
			if err = json.Unmarshal(b, &in); err == nil && in.Addr != "" {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	who := "another process"
	if in.PID > 0 {
		who = fmt.Sprintf("process %d", in.PID)
	}
	headless := false
	if err == nil {
		headless, err = ask(in)
	}
	if headless {
		return fmt.Errorf("%w for the data folder %s (%s, a headless worker without a window): stop it (Ctrl-C, or kill -TERM %d) "+
			"or start with another --data folder", ErrRunning, dir, who, in.PID)
	}
	if err != nil {
		return fmt.Errorf("%w for the data folder %s (%s holds it) but it did not answer (%v); "+
			"quit it from its window or tray, or start with another --data folder", ErrRunning, dir, who, err)
	}
	return fmt.Errorf("%w for the data folder %s (%s): its window was brought to the front", ErrRunning, dir, who)
}

// ask asks the holder in to show its window; headless reports that it has
// none (a --headless worker).
func ask(in info) (headless bool, err error) {
	c, err := net.DialTimeout("tcp", in.Addr, 2*time.Second)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "show %s\n", in.Token); err != nil {
		return false, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return false, err
	}
	switch strings.TrimSpace(line) {
	case "ok":
		return false, nil
	case "headless":
		return true, nil
	}
	return false, fmt.Errorf("answered %q", strings.TrimSpace(line))
}

// Release stops answering, removes instance.json and unlocks the folder.
// It is safe to call more than once.
func (l *Lock) Release() error {
	if l.ln != nil {
		l.ln.Close()
		l.wg.Wait()
		l.ln = nil
		_ = os.Remove(filepath.Join(l.dir, InfoFile))
	}
	if l.f == nil {
		return nil
	}
	err := fslock.Unlock(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
