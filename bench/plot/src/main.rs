//! deliba-plot: draws the three figures of bench/deliba-grid.sh from its
//! summary.csv (medians per peer, block size and workload):
//! `latency.png` (iodepth-1 p50 bars with a p99 whisker), `throughput.png`
//! (MB/s at iodepth 32) and `iops.png` (IOPS at iodepth 32), one panel per
//! block size, one bar per peer.
//!
//! usage: deliba-plot SUMMARY.csv OUTDIR
//!
//! Text is rendered with plotters' pure-Rust `ab_glyph` backend from a
//! TrueType font found on disk (DejaVu Sans, Liberation Sans, or
//! `$DELIBA_PLOT_FONT`), so no fontconfig/freetype is needed.

use plotters::prelude::*;
use plotters::style::FontStyle;
use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

const RW: [&str; 4] = ["read", "write", "randread", "randwrite"];
const PEERS: [&str; 5] = ["iolift", "iolift+cs", "iolift-poll", "qemu-nbd", "fio-rbd"];
/// One per entry of PEERS (then spares for unknown peers).
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
    RGBColor(214, 39, 40),
];

#[derive(Clone, Copy, Default)]
struct Cell {
    p50: f64,
    p99: f64,
    iops: f64,
    mbps: f64,
}

type Table = BTreeMap<(String, String, String), Cell>;

fn load(path: &Path) -> Result<Table, Box<dyn Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines();
    let hdr: Vec<&str> = lines.next().ok_or("empty summary")?.split(',').collect();
    let col = |name: &str| {
        hdr.iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("summary has no column {name}"))
    };
    let (cp, cb, cr) = (col("peer")?, col("bs")?, col("rw")?);
    let (c50, c99, ci, cm) = (
        col("lat_p50_us")?,
        col("lat_p99_us")?,
        col("iops")?,
        col("mbps")?,
    );
    let mut t = Table::new();
    for l in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split(',').collect();
        let num = |i: usize| {
            f.get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        t.insert(
            (f[cp].to_string(), f[cb].to_string(), f[cr].to_string()),
            Cell {
                p50: num(c50),
                p99: num(c99),
                iops: num(ci),
                mbps: num(cm),
            },
        );
    }
    Ok(t)
}

fn register_font() -> Result<(), Box<dyn Error>> {
    let mut cands: Vec<String> = std::env::var("DELIBA_PLOT_FONT").into_iter().collect();
    cands.extend(
        [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
        ]
        .map(String::from),
    );
    for c in &cands {
        if let Ok(bytes) = std::fs::read(c) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    Err(format!(
        "no usable TrueType font (tried {}; set DELIBA_PLOT_FONT=path.ttf or install fonts-dejavu-core)",
        cands.join(", ")
    )
    .into())
}

/// What one figure shows.
struct Fig {
    file: &'static str,
    title: &'static str,
    ylabel: &'static str,
    value: fn(&Cell) -> f64,
    /// Whisker top (p99 for latency).
    whisker: Option<fn(&Cell) -> f64>,
}

fn draw(t: &Table, outdir: &Path, fig: &Fig) -> Result<(), Box<dyn Error>> {
    let mut peers: Vec<String> = PEERS
        .iter()
        .filter(|p| t.keys().any(|k| k.0 == **p))
        .map(|p| p.to_string())
        .collect();
    for k in t.keys() {
        if !peers.contains(&k.0) {
            peers.push(k.0.clone());
        }
    }
    let mut bss: Vec<String> = Vec::new();
    for k in t.keys() {
        if !bss.contains(&k.1) {
            bss.push(k.1.clone());
        }
    }
    bss.sort_by_key(|b| {
        let n: u64 = b
            .trim_end_matches(['k', 'K', 'm', 'M'])
            .parse()
            .unwrap_or(0);
        if b.ends_with(['m', 'M']) {
            n * 1024
        } else {
            n
        }
    });
    let path = outdir.join(fig.file);
    let root = BitMapBackend::new(&path, (560 * bss.len().max(1) as u32, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(fig.title, ("sans-serif", 22))?;
    let panels = root.split_evenly((1, bss.len().max(1)));
    let nrw = RW.len() as f64;
    let width = 0.8 / peers.len().max(1) as f64;
    for (panel, bs) in panels.iter().zip(&bss) {
        let top = |c: &Cell| {
            fig.whisker
                .map_or((fig.value)(c), |w| w(c).max((fig.value)(c)))
        };
        let ymax = t
            .iter()
            .filter(|(k, _)| &k.1 == bs)
            .map(|(_, c)| top(c))
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.12;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{bs} blocks"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..nrw, 0f64..ymax)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * RW.len() + 1)
            .x_label_formatter(&|x| {
                let i = x.floor();
                if (x - i - 0.5).abs() < 1e-6 && (i as usize) < RW.len() {
                    RW[i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{v:.0}"))
            .y_desc(fig.ylabel)
            .label_style(("sans-serif", 13))
            .draw()?;
        for (pi, peer) in peers.iter().enumerate() {
            // The same peer has the same colour in every figure.
            let ci = PEERS
                .iter()
                .position(|p| p == peer)
                .unwrap_or(PEERS.len() + pi);
            let color = COLORS[ci % COLORS.len()];
            let bars: Vec<(f64, Cell)> = RW
                .iter()
                .enumerate()
                .filter_map(|(ri, rw)| {
                    t.get(&(peer.clone(), bs.clone(), rw.to_string()))
                        .map(|c| (ri as f64 + 0.1 + pi as f64 * width, *c))
                })
                .filter(|(_, c)| (fig.value)(c).is_finite())
                .collect();
            chart
                .draw_series(bars.iter().map(|(x, c)| {
                    Rectangle::new(
                        [(*x, 0.0), (*x + width * 0.92, (fig.value)(c))],
                        color.filled(),
                    )
                }))?
                .label(peer.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
            if let Some(w) = fig.whisker {
                chart.draw_series(bars.iter().filter(|(_, c)| w(c).is_finite()).map(
                    |(x, c)| {
                        let xc = *x + width * 0.46;
                        PathElement::new(
                            vec![(xc, (fig.value)(c)), (xc, w(c))],
                            BLACK.stroke_width(2),
                        )
                    },
                ))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: deliba-plot SUMMARY.csv OUTDIR");
        std::process::exit(2);
    }
    let run = || -> Result<(), Box<dyn Error>> {
        register_font()?;
        let t = load(Path::new(&args[1]))?;
        if t.is_empty() {
            return Err("summary has no rows".into());
        }
        let out = Path::new(&args[2]);
        let figs = [
            Fig {
                file: "latency.png",
                title: "Latency at iodepth 1 (bar: p50, whisker: p99)",
                ylabel: "microseconds",
                value: |c| c.p50,
                whisker: Some(|c| c.p99),
            },
            Fig {
                file: "throughput.png",
                title: "Throughput at iodepth 32",
                ylabel: "MB/s",
                value: |c| c.mbps,
                whisker: None,
            },
            Fig {
                file: "iops.png",
                title: "IOPS at iodepth 32",
                ylabel: "IOPS",
                value: |c| c.iops,
                whisker: None,
            },
        ];
        for f in &figs {
            draw(&t, out, f)?;
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("deliba-plot: error: {e}");
        std::process::exit(1);
    }
}
