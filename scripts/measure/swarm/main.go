// Command swarm (scripts/measure-app.sh): a loopback swarm
// (backbone/swarmtest, hub on its defaults) that prints its gateway URL and CA
// file, then serves until killed; with -load it asks for expert outputs.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
)

func main() {
	dir := flag.String("dir", "/tmp/contrib-swarm", "folder")
	load := flag.Duration("load-after", 0, "start a load this long after start (0: never)")
	flag.Parse()
	sw, err := swarmtest.Start(*dir, time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(sw.URL, sw.CAFile)
	if *load > 0 {
		go func() { time.Sleep(*load); sw.Load(16, 20*time.Millisecond) }()
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	<-c
	sw.Close()
}
