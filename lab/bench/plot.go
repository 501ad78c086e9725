package bench

import (
	"fmt"
	"image/color"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot draws ops/s against clients, one line per target, for one workload,
// into a PNG at path.
func Plot(rs []Result, workload, title, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = "operations per second"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = clientTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	byTarget := map[string]plotter.XYs{}
	for _, r := range rs {
		if r.Workload == workload && r.PerSecond > 0 {
			byTarget[r.Target] = append(byTarget[r.Target], plotter.XY{X: float64(r.Clients), Y: r.PerSecond})
		}
	}
	targets := make([]string, 0, len(byTarget))
	for t := range byTarget {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	// A target and its " (stream)" variant share a color and a shape; the
	// variant's line is dashed.
	bases := map[string]int{}
	for _, t := range targets {
		base := strings.TrimSuffix(t, " (stream)")
		if _, ok := bases[base]; !ok {
			bases[base] = len(bases)
		}
	}
	for _, t := range targets {
		pts := byTarget[t]
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		i := bases[strings.TrimSuffix(t, " (stream)")]
		c := plotutil.Color(i)
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		if strings.HasSuffix(t, " (stream)") {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(t, line, points)
	}
	p.Y.Min = 0
	p.BackgroundColor = color.White
	if len(targets) == 0 {
		return fmt.Errorf("bench: no %s results to plot", workload)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// clientTicks marks the client counts measured.
type clientTicks struct{}

func (clientTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, v := range []float64{1, 2, 4, 8, 16, 32, 64, 128, 256} {
		if v >= lo && v <= hi {
			ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprint(v)})
		}
	}
	return ts
}
